/**
 * The user's account (docs/api.md, "GET /0/user/"): the login, whether its e-mail address is confirmed (with the
 * confirmation e-mail sent again on request, `POST /0/session/resend`), and the authcode a phone broadcasts to make
 * devices near (docs/api.md, "GET /0/network/"). Read afresh on each visit: a confirmation made in another tab and
 * a rotated authcode show at once. Nothing is changed here.
 */
import { useEffect, useState } from 'preact/hooks';
import { call, getJson } from '../api.js';
import { href } from '../router.js';
import type { UserInfo } from '../session.js';
import { useSession } from '../session.js';
import { useProduct } from './fleet/product.js';
import { say } from './fleet/say.js';

export function Account() {
  const session = useSession();
  const product = useProduct();
  const [user, setUser] = useState<UserInfo | undefined>(session.kind === 'user' ? session.user : undefined);
  const [message, setMessage] = useState<{ text: string; error: boolean } | undefined>();
  const [busy, setBusy] = useState(false);

  useEffect(() => {
    void getJson<UserInfo>('/0/user/').then((u) => u && setUser(u));
  }, []);

  if (!user) {
    return (
      <main>
        <h1>Account</h1>
        <p class="note" role="status">
          Loading…
        </p>
      </main>
    );
  }

  const resend = async () => {
    setBusy(true);
    setMessage(undefined);
    const a = await call('POST', '/0/session/resend', { login: user.login });
    setBusy(false);
    setMessage(
      a.status === 200
        ? { text: `A confirmation e-mail is on its way to ${user.login}. Open its link to confirm.`, error: false }
        : { text: say(a), error: true },
    );
  };

  const nearby = product.state === 'ready' && product.frontend.nearby;
  return (
    <main>
      <h1>Account</h1>
      <dl class="fl-facts">
        <dt>E-mail address</dt>
        <dd data-field="login">{user.login}</dd>
        <dt>Confirmed</dt>
        <dd data-field="confirmed">
          {user.confirmed ? (
            <span class="fl-badge fl-badge-ok">confirmed</span>
          ) : (
            <>
              <span class="fl-badge fl-badge-warn">not confirmed</span>{' '}
              <button type="button" class="secondary" disabled={busy} onClick={() => void resend()}>
                Send the confirmation e-mail again
              </button>
            </>
          )}
        </dd>
        <dt>Authcode</dt>
        <dd data-field="authcode">
          <code class="fl-code">{user.authcode}</code>
        </dd>
      </dl>
      {message && (
        <p role={message.error ? 'alert' : 'status'} class={message.error ? 'error' : 'note'}>
          {message.text}
        </p>
      )}
      <section aria-labelledby="fl-authcode-how">
        <h2 id="fl-authcode-how">What the authcode is for</h2>
        <p>
          A phone makes devices near you by broadcasting this code on the local network: a UDP datagram to port 590
          holding the 32 hex digits (a newline after them is allowed). A devcloud agent that hears it tells the bridge,
          and for 5 minutes the device is near you
          {nearby ? (
            <>
              : it shows in <a href={href('nearby')}>Nearby devices</a>, where you can claim it.
            </>
          ) : (
            '.'
          )}
        </p>
        <p>
          The code changes every 24 hours, and the previous one still counts for an hour after. Anyone who learns it can
          have a device say it is near you, so keep it to your own phone.
        </p>
      </section>
    </main>
  );
}
