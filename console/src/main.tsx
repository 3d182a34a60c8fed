/**
 * The devcloud console (docs/console.md): a web app the bridge serves at `/console/`, built only on the public REST
 * API and the live channel, so that it is also the reference app for them.
 */
import { render } from 'preact';
import { useEffect } from 'preact/hooks';
import { Account } from './pages/Account.js';
import { Device } from './pages/Device.js';
import { Devices } from './pages/Devices.js';
import { Events } from './pages/Events.js';
import { Firmware } from './pages/Firmware.js';
import { Login } from './pages/Login.js';
import { Nearby } from './pages/Nearby.js';
import { Rules } from './pages/Rules.js';
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
  const pages: Array<[string, string]> = [
    ['devices', 'Devices'],
    ['nearby', 'Nearby'],
    ['rules', 'Rules'],
    ['events', 'Events'],
    ['firmware', 'Firmware'],
    ['account', 'Account'],
  ];
  let content;
  switch (page) {
    case 'devices':
      content = route[1] === undefined ? <Devices /> : <Device id={route[1]} />;
      break;
    case 'nearby':
      content = <Nearby />;
      break;
    case 'rules':
      content = <Rules />;
      break;
    case 'events':
      content = <Events />;
      break;
    case 'firmware':
      content = <Firmware />;
      break;
    case 'account':
      content = <Account />;
      break;
    default:
      content = <Devices />;
  }
  return (
    <>
      <header>
        <a class="skip" href="#content">
          Skip to content
        </a>
        <nav aria-label="Main">
          {pages.map(([key, label]) => (
            <a key={key} href={href(key)} aria-current={page === key ? 'page' : undefined}>
              {label}
            </a>
          ))}
        </nav>
        <span class="who">{session.user.login}</span>
        <button type="button" class="link" onClick={() => void logout()}>
          Log out
        </button>
      </header>
      <div id="content">{content}</div>
    </>
  );
}

const root = document.getElementById('app');
if (root) render(<Shell />, root);
