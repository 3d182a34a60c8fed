/**
 * The webhook outbox on the store (docs/notifications.md, "Webhooks"): the event log's rows whose webhook delivery
 * is pending are the queue the worker (bridge/rules/webhook-worker.ts) takes from, leased so that one bridge at a
 * time tries each, and the outcome of every attempt is written back on the event.
 */
import type { Logger } from '../../lib/log.js';
import type { BridgeStore } from '../store/types.js';
import { webhookBody } from './view.js';
import type { DueDelivery, WebhookOutbox } from './webhook-worker.js';

export function webhookOutbox(store: BridgeStore, log: Logger): WebhookOutbox {
  return {
    async claimDue(now, limit, leaseMs) {
      const due = await store.write((tx) => tx.rules.claimDueWebhooks(now, limit, leaseMs));
      const out: DueDelivery[] = [];
      for (const { event, secret } of due) {
        if (event.webhookUrl === null) continue;
        if (secret === null) {
          // The rule was removed, or its webhook taken off, before the event went out: nothing to sign it with.
          const at = now;
          await store.write((tx) =>
            tx.rules.recordWebhook(event.id, {
              state: 'failed',
              attempts: event.webhookAttempts,
              status: null,
              error: 'the rule or its webhook was removed',
              at,
              nextAt: null,
            }),
          );
          log.warn({
            event: 'webhook.failed',
            eventId: event.id,
            attempts: event.webhookAttempts,
            reason: 'rule removed',
          });
          continue;
        }
        out.push({
          eventId: event.id,
          url: event.webhookUrl,
          secret,
          body: webhookBody(event),
          attempts: event.webhookAttempts,
          firedAt: event.at,
        });
      }
      return out;
    },
    async record(eventId, o) {
      await store.write((tx) => tx.rules.recordWebhook(eventId, o));
    },
  };
}
