import { api, fmtMs, fmtTime } from '../api.js';
import { usePoll } from '../hooks.js';

/** The open Kafka transaction's age against `transaction.timeout.ms` and its warn mark. */
export function Transactions() {
  const t = usePoll(() => api('GET', '/transactions'), 1000);
  const v = t.data;
  const pct = v && v.transaction_timeout_ms ? Math.min(100, (100 * (v.age_ms || 0)) / v.transaction_timeout_ms) : 0;
  const warnPct = v && v.transaction_timeout_ms ? (100 * v.warn_after_ms) / v.transaction_timeout_ms : 80;
  const level = v && v.age_ms >= v.warn_after_ms ? 'bad' : 'ok';
  return (
    <section>
      <h1>Transactions</h1>
      {t.error && <p class="error">{t.error.message}</p>}
      {v && (
        <>
          <div class="panel">
            <p>
              Open transaction age: <b class={level} data-testid="tx-age">{v.open ? fmtMs(v.age_ms) : 'none open'}</b> of a{' '}
              {fmtMs(v.transaction_timeout_ms)} timeout (warning at {fmtMs(v.warn_after_ms)})
            </p>
            <div class="bar" role="meter" aria-valuenow={pct} aria-valuemin="0" aria-valuemax="100">
              <Fill pct={pct} level={level} />
              <Mark pct={warnPct} />
            </div>
          </div>
          <table>
            <tbody>
              <Row k="transactional id" v={<span class="mono">{v.transactional_id}</span>} />
              <Row k="open" v={String(v.open)} />
              <Row k="opened" v={fmtTime(v.opened_at_ms)} />
              <Row k="ends with checkpoint" v={<span class="mono">{v.checkpoint ?? '—'}</span>} />
              <Row k="last committed checkpoint" v={<span class="mono">{v.last_committed_checkpoint ?? '—'}</span>} />
              <Row k="transactions begun / committed / aborted" v={`${v.transactions_begun} / ${v.committed} / ${v.aborted}`} />
              <Row k="producer inits (fencing)" v={`${v.producer_inits} at ${fmtTime(v.producer_initialized_at_ms)}`} />
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}

function Row({ k, v }) {
  return (
    <tr>
      <th>{k}</th>
      <td>{v}</td>
    </tr>
  );
}

// Widths are set through the CSSOM (element.style), which the policy's style-src 'self'
// allows; a style="" attribute in markup it would not.
function Fill({ pct, level }) {
  return <div class={`fill ${level}`} ref={(el) => el && (el.style.width = `${pct}%`)} />;
}

function Mark({ pct }) {
  return <div class="mark" title="warning threshold" ref={(el) => el && (el.style.left = `${pct}%`)} />;
}
