import { useRef, useState } from 'preact/hooks';
import { api, fmtBytes, fmtMs, fmtRate, metrics, total } from '../api.js';
import { Chart } from '../chart.jsx';
import { usePoll } from '../hooks.js';

/** Samples kept for the charts: five minutes at one a second. */
const KEEP = 300;

/**
 * Who this instance is, what it owns, and its throughput and lag as live charts, from
 * `/metrics` polled every second (rates are differences between two scrapes; no
 * Prometheus needed).
 */
export function Overview() {
  const info = usePoll(() => api('GET', '/instance'), 5000);
  const ready = usePoll(
    () => api('GET', '/readyz').then(() => true, (e) => (e.status === 503 ? false : Promise.reject(e))),
    2000,
  );
  const last = useRef(null);
  const [series, setSeries] = useState([[], [], [], [], []]);
  const [now, setNow] = useState({});
  usePoll(async () => {
    const m = await metrics();
    const t = Date.now() / 1000;
    const cur = {
      t,
      consumed: total(m, 'streamstate_records_consumed_total'),
      produced: total(m, 'streamstate_records_produced_total'),
      dead: total(m, 'streamstate_records_dead_lettered_total'),
      lag: total(m, 'streamstate_consumer_lag_records'),
      checkpoints: total(m, 'streamstate_checkpoints_completed_total'),
      failed: total(m, 'streamstate_checkpoints_failed_total'),
      lastTs: total(m, 'streamstate_last_checkpoint_completed_timestamp_seconds'),
      lastSize: total(m, 'streamstate_last_checkpoint_size_bytes'),
      rules: total(m, 'streamstate_rules_active'),
    };
    const prev = last.current;
    last.current = cur;
    if (!prev || cur.t <= prev.t) {
      setNow(cur);
      return;
    }
    const dt = cur.t - prev.t;
    const rate = (k) => Math.max(0, (cur[k] - prev[k]) / dt);
    cur.in = rate('consumed');
    cur.out = rate('produced');
    cur.dlq = rate('dead');
    setNow(cur);
    setSeries((s) => {
      const next = s.map((col) => col.slice(-(KEEP - 1)));
      next[0].push(t);
      next[1].push(cur.in);
      next[2].push(cur.out);
      next[3].push(cur.dlq);
      next[4].push(cur.lag);
      return next;
    });
  }, 1000);

  const i = info.data;
  const since = now.lastTs ? Date.now() - now.lastTs * 1000 : null;
  return (
    <section>
      <h1>Overview</h1>
      <div class="tiles">
        <Tile label="Instance" testid="instance">
          {i ? `${i.app_id} #${i.instance} of ${i.instances}` : '…'}
        </Tile>
        <Tile label="Readiness" testid="ready">
          {ready.data === undefined ? '…' : ready.data ? <b class="ok">ready</b> : <b class="bad">not ready</b>}
        </Tile>
        <Tile label="Records in / s" testid="rate-in">
          {fmtRate(now.in)}
        </Tile>
        <Tile label="Records out / s" testid="rate-out">
          {fmtRate(now.out)}
        </Tile>
        <Tile label="Dead-lettered / s" testid="rate-dlq">
          {fmtRate(now.dlq)}
        </Tile>
        <Tile label="Consumer lag" testid="lag">
          {now.lag == null ? '—' : now.lag.toLocaleString()}
        </Tile>
        <Tile label="Consumed (total)" testid="consumed-total">
          {now.consumed == null ? '—' : now.consumed.toLocaleString()}
        </Tile>
        <Tile label="Last checkpoint" testid="last-checkpoint">
          {since == null ? 'none yet' : `${fmtMs(since)} ago · ${fmtBytes(now.lastSize)}`}
        </Tile>
        <Tile label="Checkpoints ok / failed">
          {now.checkpoints == null ? '—' : `${now.checkpoints} / ${now.failed}`}
        </Tile>
        <Tile label="Rules in force">{now.rules ?? '—'}</Tile>
      </div>
      {i && (
        <p class="owned" data-testid="owned">
          Owns{' '}
          {i.key_groups ? `key groups ${i.key_groups.first}–${i.key_groups.last}` : 'key groups (not known here)'} and{' '}
          {i.partitions.length
            ? i.partitions.map((p) => `${p.topic}[${p.partition}]`).join(', ')
            : 'no partitions yet'}
          ; {i.function} function on {i.backend}, checkpoint every {fmtMs(i.checkpoint_interval_ms)}.
        </p>
      )}
      <div class="charts">
        <Chart
          title="Records per second"
          testid="chart-throughput"
          data={series.slice(0, 4)}
          series={[
            { label: 'in', fmt: fmtRate },
            { label: 'out', fmt: fmtRate },
            { label: 'dead-lettered', fmt: fmtRate },
          ]}
        />
        <Chart
          title="Consumer lag (records)"
          testid="chart-lag"
          data={[series[0], series[4]]}
          series={[{ label: 'lag', fmt: (v) => Math.round(v).toLocaleString() }]}
        />
      </div>
      {(info.error || ready.error) && <p class="error">{(info.error || ready.error).message}</p>}
    </section>
  );
}

function Tile({ label, children, testid }) {
  return (
    <div class="tile">
      <div class="tile-label">{label}</div>
      <div class="tile-value" data-testid={testid}>
        {children}
      </div>
    </div>
  );
}
