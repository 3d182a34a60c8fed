/**
 * The devcloud console (docs/console.md): a web app the bridge serves at `/console/`, built only on the public REST
 * API and the live channel, so that it is also the reference app for them.
 */
import { render } from 'preact';
import { useEffect } from 'preact/hooks';
import { Devices } from './pages/Devices.js';
import { Login } from './pages/Login.js';
import { href, useRoute } from './router.js';
import { logout, refresh, useSession } from './session.js';

function Shell() {
  const session = useSession();
  const route = useRoute();
  useEffect(() => void refresh(), []);
  if (session.kind === 'loading') return <p class="note">Loading…</p>;
  if (session.kind === 'anonymous') {
    const mode = route[0] === 'signup' ? 'signup' : route[0] === 'recover' ? 'recover' : 'login';
    return <Login mode={mode} />;
  }
  const page = route[0] ?? 'devices';
  return (
    <>
      <header>
        <a class="skip" href="#content">
          Skip to content
        </a>
        <nav aria-label="Main">
          <a href={href('devices')} aria-current={page === 'devices' ? 'page' : undefined}>
            Devices
          </a>
        </nav>
        <span class="who">{session.user.login}</span>
        <button type="button" class="link" onClick={() => void logout()}>
          Log out
        </button>
      </header>
      <div id="content">{page === 'devices' ? <Devices /> : <Devices />}</div>
    </>
  );
}

const root = document.getElementById('app');
if (root) render(<Shell />, root);
