/** Log in, sign up, and ask for a password reset: the session routes (docs/api.md, "Endpoints"). */
import { useState } from 'preact/hooks';
import { call, explain } from '../api.js';
import { href } from '../router.js';
import { refresh } from '../session.js';

type Mode = 'login' | 'signup' | 'recover';

export function Login({ mode }: { mode: Mode }) {
  const [login, setLogin] = useState('');
  const [password, setPassword] = useState('');
  const [message, setMessage] = useState<{ text: string; error: boolean } | undefined>();
  const [busy, setBusy] = useState(false);

  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setMessage(undefined);
    if (mode === 'recover') {
      const a = await call('POST', '/0/session/recovery', { login });
      setMessage(
        a.status === 200
          ? { text: 'If the address has an account, a link to choose a new password is on its way.', error: false }
          : { text: explain(a), error: true },
      );
    } else {
      const path = mode === 'login' ? '/0/session/login' : '/0/session/signup';
      const a = await call('POST', path, { login, password });
      if (a.status === 201 || a.status === 200) {
        await refresh();
        location.hash = '#/devices';
      } else {
        setMessage({ text: explain(a), error: true });
      }
    }
    setBusy(false);
  };

  const title = mode === 'login' ? 'Log in' : mode === 'signup' ? 'Create an account' : 'Forgotten password';
  return (
    <main class="narrow">
      <h1>{title}</h1>
      <form onSubmit={(e) => void submit(e)}>
        <label>
          E-mail address
          <input
            type="email"
            name="login"
            autocomplete="username"
            required
            value={login}
            onInput={(e) => setLogin(e.currentTarget.value)}
          />
        </label>
        {mode !== 'recover' && (
          <label>
            Password
            <input
              type="password"
              name="password"
              autocomplete={mode === 'signup' ? 'new-password' : 'current-password'}
              required
              minLength={mode === 'signup' ? 8 : undefined}
              value={password}
              onInput={(e) => setPassword(e.currentTarget.value)}
            />
          </label>
        )}
        <button type="submit" disabled={busy}>
          {title}
        </button>
        {message && (
          <p role={message.error ? 'alert' : 'status'} class={message.error ? 'error' : 'note'}>
            {message.text}
          </p>
        )}
      </form>
      <nav class="links" aria-label="Account">
        {mode !== 'login' && <a href={href('login')}>Log in</a>}
        {mode !== 'signup' && <a href={href('signup')}>Create an account</a>}
        {mode !== 'recover' && <a href={href('recover')}>Forgotten password</a>}
      </nav>
    </main>
  );
}
