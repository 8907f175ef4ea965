import { useEffect, useState } from 'preact/hooks';
import { api } from '../api.js';
import { Tree } from '../tree.jsx';

/**
 * `GET /state/{key}` (token), shown as a tree. A key another instance owns: the server
 * names the owner (asked with `redirect=false`, since the page may only call its own
 * origin) and the page offers that instance's console with the key filled in.
 */
export function StateLookup({ arg }) {
  const [key, setKey] = useState(arg || '');
  const [result, setResult] = useState(null);
  const lookup = async (k) => {
    if (!k) return;
    setResult({ busy: true });
    try {
      const v = await api('GET', `/state/${encodeURIComponent(k)}?redirect=false`, { auth: true });
      setResult({ value: v });
    } catch (e) {
      setResult({ error: e.message, status: e.status, body: e.body });
    }
  };
  useEffect(() => {
    if (arg) lookup(arg);
  }, [arg]);
  const owner = result?.status === 421 && result.body;
  return (
    <section>
      <h1>State</h1>
      <div class="actions">
        <input
          data-testid="state-key"
          placeholder="key, e.g. user-42"
          value={key}
          onInput={(e) => setKey(e.currentTarget.value)}
          onKeyDown={(e) => e.key === 'Enter' && lookup(key)}
        />
        <button data-testid="state-lookup" onClick={() => lookup(key)}>
          Look up
        </button>
      </div>
      {result?.busy && <p>Looking up…</p>}
      {result?.error && (
        <p class="error" data-testid="state-error">
          {result.error}
        </p>
      )}
      {owner && owner.owner_admin_url && (
        <p>
          Open the console of instance {owner.owner_instance}:{' '}
          <a data-testid="state-owner" href={`${owner.owner_admin_url}/#/state/${encodeURIComponent(key)}`}>
            {owner.owner_admin_url}
          </a>{' '}
          (paste the token there too: it is kept per tab and origin).
        </p>
      )}
      {result?.value && (
        <div class="panel" data-testid="state-result">
          <p>
            Key <span class="mono">{result.value.key}</span> · key group {result.value.key_group} · instance{' '}
            {result.value.instance}
          </p>
          <Tree value={result.value.states} name="states" />
        </div>
      )}
    </section>
  );
}
