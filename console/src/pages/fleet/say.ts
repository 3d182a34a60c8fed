/**
 * Words for the answers of the fleet views (claim, share, unregister, rules, events, account), over `explain()`
 * of api.ts: the tokens it does not know, and a more precise sentence where these views know the context
 * (docs/api.md, "Answer tokens"; docs/notifications.md, "Rules").
 */
import { type Answer, explain } from '../../api.js';

const MORE: Record<string, string> = {
  'claim-fail':
    'The device could not be claimed: someone else owns it, it is no longer near you, or this frontend does not ' +
    'allow claims.',
  'share-fail':
    'The device could not be shared: check the e-mail address (an account of this site, not yours), and that you ' +
    'own the device.',
  'device-fail': 'The device is not one you may change, or it is gone.',
  'event-fail': 'A field is missing or malformed, or the rule is gone.',
  'resend-fail': 'The e-mail could not be sent: the address may be confirmed already.',
  'not found': 'Not found: the site this console was opened for may not exist any more.',
};

export function say(a: Answer): string {
  if (a.status === 0 || a.status === 429) return explain(a);
  return MORE[a.text] ?? explain(a);
}
