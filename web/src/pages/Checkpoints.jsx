import { api, fmtBytes, fmtMs, fmtTime, metrics } from '../api.js';
import { Action } from '../action.jsx';
import { Chart } from '../chart.jsx';
import { usePoll } from '../hooks.js';

/** Rows shown; the server keeps the last 200 attempts. */
const ROWS = 60;

/**
 * Like Flink's Checkpoints tab: every attempt of this run (and the restored one) with
 * trigger, status, duration and sizes, a chart of duration and size, the mean time of
 * each phase, savepoints, and buttons to take a checkpoint or a savepoint (token).
 */
export function Checkpoints() {
  const list = usePoll(() => api('GET', '/checkpoints'), 2000);
  const savepoints = usePoll(() => api('GET', '/savepoints'), 10000);
  const phases = usePoll(async () => {
    const m = await metrics();
    const get = (name) => m.get(name) || [];
    const out = {};
    for (const s of get('streamstate_checkpoint_phase_duration_seconds_sum')) {
      out[s.labels.phase] = { sum: s.value };
    }
    for (const s of get('streamstate_checkpoint_phase_duration_seconds_count')) {
      if (out[s.labels.phase]) out[s.labels.phase].count = s.value;
    }
    return out;
  }, 5000);
  const all = list.data || [];
  const chrono = all.filter((c) => c.status === 'completed' && c.trigger !== 'restored').slice().reverse();
  const data = [
    chrono.map((c) => c.end_time_ms / 1000),
    chrono.map((c) => c.duration_ms),
    chrono.map((c) => c.size_bytes),
    chrono.map((c) => c.incremental_size_bytes),
  ];
  return (
    <section>
      <h1>Checkpoints</h1>
      <div class="actions">
        <Action
          label="Trigger checkpoint"
          testid="trigger-checkpoint"
          run={async () => {
            const r = await api('POST', '/checkpoints', { auth: true });
            list.refresh();
            return `${r.name} completed in ${fmtMs(r.duration_ms)}`;
          }}
        />
        <Action
          label="Take savepoint"
          testid="trigger-savepoint"
          run={async () => {
            const r = await api('POST', '/savepoints', { auth: true, body: {} });
            list.refresh();
            savepoints.refresh();
            return `${r.id} written to ${r.location}`;
          }}
        />
      </div>
      <PhaseMeans phases={phases.data} />
      <div class="charts">
        <Chart
          title="Duration and size of completed checkpoints"
          testid="chart-checkpoints"
          data={data}
          series={[
            { label: 'duration', fmt: fmtMs },
            { label: 'size', scale: 'bytes', fmt: fmtBytes },
            { label: 'incremental', scale: 'bytes', fmt: fmtBytes },
          ]}
        />
      </div>
      {list.error && <p class="error">{list.error.message}</p>}
      <table data-testid="checkpoint-history">
        <thead>
          <tr>
            <th>id</th>
            <th>name</th>
            <th>trigger</th>
            <th>status</th>
            <th>started</th>
            <th>duration</th>
            <th>phases</th>
            <th>size</th>
            <th>incremental</th>
          </tr>
        </thead>
        <tbody>
          {all.slice(0, ROWS).map((c) => (
            <tr key={`${c.name}-${c.start_time_ms}`} class={c.status} data-trigger={c.trigger}>
              <td>{c.id}</td>
              <td class="mono">{c.name}</td>
              <td>{c.trigger}</td>
              <td>
                {c.status}
                {c.error && <div class="error">{c.error}</div>}
              </td>
              <td>{fmtTime(c.start_time_ms)}</td>
              <td>{fmtMs(c.duration_ms)}</td>
              <td data-testid="checkpoint-phases">{phaseText(c.phases)}</td>
              <td>{fmtBytes(c.size_bytes)}</td>
              <td>{fmtBytes(c.incremental_size_bytes)}</td>
            </tr>
          ))}
        </tbody>
      </table>
      <h2>Savepoints</h2>
      {savepoints.error && <p class="error">{savepoints.error.message}</p>}
      <table data-testid="savepoints">
        <thead>
          <tr>
            <th>id</th>
            <th>checkpoint</th>
            <th>created</th>
            <th>size</th>
            <th>location</th>
          </tr>
        </thead>
        <tbody>
          {(savepoints.data || []).map((s) => (
            <tr key={`${s.id}-${s.location}`}>
              <td class="mono">{s.id}</td>
              <td class="mono">{s.checkpoint}</td>
              <td>{fmtTime(s.created_at_ms)}</td>
              <td>{fmtBytes(s.size_bytes)}</td>
              <td class="mono">{s.location}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </section>
  );
}

/** The phases in the order a checkpoint goes through them (the JSON object has none). */
const PHASES = ['snapshot_ms', 'flush_ms', 'upload_ms', 'commit_ms'];

/** A phase's first part, shown inside it: the upload's `materialize_ms` (RocksDB's flush
 *  and links, the hashes) came before its copy into checkpoint storage. */
const PARTS = { upload_ms: 'materialize_ms' };

const phaseName = (k) => k.replace(/_ms$/, '');

/** Per-checkpoint phases when the record carries them (`phases: {snapshot_ms, …}`). */
function phaseText(p) {
  if (!p) return '—';
  const parts = Object.values(PARTS);
  const rest = Object.keys(p).filter((k) => !PHASES.includes(k) && !parts.includes(k));
  return [...PHASES.filter((k) => k in p), ...rest]
    .map((k) => {
      const text = `${phaseName(k)} ${fmtMs(p[k])}`;
      const part = PARTS[k];
      return part && part in p ? `${text} (${phaseName(part)} ${fmtMs(p[part])})` : text;
    })
    .join(' · ');
}

function PhaseMeans({ phases }) {
  if (!phases || !Object.keys(phases).length) return null;
  return (
    <p class="phases" data-testid="phase-means">
      Mean time per phase since start:{' '}
      {['snapshot', 'flush', 'upload', 'commit']
        .filter((k) => phases[k] && phases[k].count)
        .map((k) => `${k} ${fmtMs((phases[k].sum / phases[k].count) * 1000)}`)
        .join(' · ')}
    </p>
  );
}
