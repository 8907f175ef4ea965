import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { token } from './api.js';
import { Overview } from './pages/Overview.jsx';
import { Checkpoints } from './pages/Checkpoints.jsx';
import { Rules } from './pages/Rules.jsx';
import { StateLookup } from './pages/StateLookup.jsx';
import { Transactions } from './pages/Transactions.jsx';
import './style.css';

const PAGES = [
  ['overview', 'Overview', Overview],
  ['checkpoints', 'Checkpoints', Checkpoints],
  ['rules', 'Rules', Rules],
  ['state', 'State', StateLookup],
  ['transactions', 'Transactions', Transactions],
];

/** `#/<page>/<arg>`: the page and an optional argument (the state page's key). */
function route() {
  const [, page = 'overview', ...rest] = location.hash.split('/');
  const arg = rest.length ? decodeURIComponent(rest.join('/')) : undefined;
  return { page: PAGES.some(([id]) => id === page) ? page : 'overview', arg };
}

function TokenBar() {
  const [saved, setSaved] = useState(!!token.get());
  const [draft, setDraft] = useState('');
  if (saved) {
    return (
      <div class="token" data-testid="token-set">
        <span>Token set for this tab (session storage only)</span>
        <button
          onClick={() => {
            token.clear();
            setSaved(false);
          }}
        >
          Forget
        </button>
      </div>
    );
  }
  const use = () => {
    if (!draft.trim()) return;
    token.set(draft);
    setDraft('');
    setSaved(true);
  };
  return (
    <div class="token">
      <input
        type="password"
        placeholder="admin token"
        title="needed for actions and state lookups; kept in this tab only"
        aria-label="admin token"
        data-testid="token-input"
        value={draft}
        onInput={(e) => setDraft(e.currentTarget.value)}
        onKeyDown={(e) => e.key === 'Enter' && use()}
      />
      <button data-testid="token-use" onClick={use}>
        Use token
      </button>
    </div>
  );
}

function App() {
  const [r, setR] = useState(route());
  useEffect(() => {
    const on = () => setR(route());
    addEventListener('hashchange', on);
    return () => removeEventListener('hashchange', on);
  }, []);
  const Page = PAGES.find(([id]) => id === r.page)[2];
  return (
    <>
      <header>
        <span class="brand">streamstate</span>
        <nav>
          {PAGES.map(([id, title]) => (
            <a href={`#/${id}`} class={id === r.page ? 'active' : ''} data-testid={`nav-${id}`}>
              {title}
            </a>
          ))}
        </nav>
        <TokenBar />
      </header>
      <main>
        <Page arg={r.arg} />
      </main>
    </>
  );
}

render(<App />, document.getElementById('app'));
