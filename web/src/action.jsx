import { useState } from 'preact/hooks';

/**
 * A button for a guarded call: shows "working…" while it runs, then its outcome (the
 * server's message on refusal, e.g. 401 without the token).
 */
export function Action({ label, run, testid, disabled }) {
  const [state, setState] = useState({ busy: false });
  const go = async () => {
    setState({ busy: true });
    try {
      const message = await run();
      setState({ busy: false, ok: true, message });
    } catch (e) {
      setState({ busy: false, ok: false, message: e.message });
    }
  };
  return (
    <span class="action">
      <button onClick={go} disabled={state.busy || disabled} data-testid={testid}>
        {state.busy ? `${label}…` : label}
      </button>
      {state.message && (
        <span class={state.ok ? 'ok' : 'error'} data-testid={testid && `${testid}-result`}>
          {state.message}
        </span>
      )}
    </span>
  );
}
