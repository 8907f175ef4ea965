import { useEffect, useState } from 'preact/hooks';
import { api, fmtTime, metrics, total } from '../api.js';
import { Action } from '../action.jsx';
import { usePoll } from '../hooks.js';
import { validateRule } from '../validate.js';

const TEMPLATE = `{
  "id": "big-orders",
  "version": 1,
  "kind": "aggregate",
  "filter": {"field": "/amount", "gt": 90},
  "aggregate": {"fn": "count", "emit": "every_event"}
}`;

/**
 * Every rule with version, status and counts; one rule's history with rollback; and an
 * editor that checks a rule against the schema before publishing it to the control
 * topic (token).
 */
export function Rules() {
  const rules = usePoll(() => api('GET', '/rules'), 2000);
  const counts = usePoll(async () => {
    const m = await metrics();
    const by = (name) => {
      const out = {};
      for (const s of m.get(name) || []) out[s.labels.rule ?? s.labels.kind] = s.value;
      return out;
    };
    return {
      suppressed: by('streamstate_rule_shadow_suppressed_outputs_total'),
      outputsByKind: by('streamstate_rule_outputs_total'),
      outputs: total(m, 'streamstate_rule_outputs_total'),
    };
  }, 5000);
  const [selected, setSelected] = useState(null);
  const [editor, setEditor] = useState(TEMPLATE);
  const all = (rules.data || []).slice().sort((a, b) => a.id.localeCompare(b.id));
  const c = counts.data;
  return (
    <section>
      <h1>Rules</h1>
      {rules.error && <p class="error">{rules.error.message}</p>}
      <table data-testid="rules">
        <thead>
          <tr>
            <th>id</th>
            <th>version</th>
            <th>status</th>
            <th>kind</th>
            <th>matches</th>
            <th>outputs</th>
            <th>suppressed outputs (shadow)</th>
            <th>applied</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {all.map((r) => (
            <tr key={r.id} data-rule={r.id} class={r.id === selected ? 'selected' : ''}>
              <td class="mono">{r.id}</td>
              <td data-testid="rule-version">{r.version}</td>
              <td data-testid="rule-status">
                <span class={`badge ${r.status}`}>{r.status}</span>
              </td>
              <td>{r.rule?.kind ?? '—'}</td>
              <td data-testid="rule-matches">{r.matches.toLocaleString()}</td>
              <td data-testid="rule-outputs">{(r.outputs ?? 0).toLocaleString()}</td>
              <td>{c?.suppressed[r.id] ?? (r.status === 'shadow' ? 0 : '—')}</td>
              <td>{fmtTime(r.applied_at_ms)}</td>
              <td>
                <button onClick={() => setSelected(r.id)}>History</button>{' '}
                <button
                  onClick={() => {
                    const body = r.rule ? { ...r.rule, version: r.version + 1 } : { id: r.id, version: r.version + 1 };
                    setEditor(JSON.stringify(body, null, 2));
                  }}
                >
                  Edit
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {c && (
        <p class="phases">
          Outputs by rule kind:{' '}
          {Object.entries(c.outputsByKind)
            .map(([k, v]) => `${k} ${v.toLocaleString()}`)
            .join(' · ') || 'none yet'}
        </p>
      )}
      {selected && <History id={selected} onChange={rules.refresh} />}
      <Editor text={editor} setText={setEditor} onPublished={rules.refresh} />
    </section>
  );
}

function History({ id, onChange }) {
  const view = usePoll(() => api('GET', `/rules/${encodeURIComponent(id)}`), 3000, [id]);
  const r = view.data;
  return (
    <div class="panel" data-testid="rule-history">
      <h2>
        History of <span class="mono">{id}</span>
      </h2>
      {view.error && <p class="error">{view.error.message}</p>}
      {r && (
        <>
          <table>
            <thead>
              <tr>
                <th>version</th>
                <th>status</th>
                <th>applied</th>
                <th>control offset</th>
                <th>body</th>
              </tr>
            </thead>
            <tbody>
              {r.history.map((v) => (
                <tr key={v.version + ':' + v.control_offset}>
                  <td>{v.version}</td>
                  <td>
                    <span class={`badge ${v.status}`}>{v.status}</span>
                  </td>
                  <td>{fmtTime(v.applied_at_ms)}</td>
                  <td>
                    {v.control_partition}:{v.control_offset}
                  </td>
                  <td>
                    <details>
                      <summary>rule</summary>
                      <pre>{JSON.stringify(v.rule, null, 2)}</pre>
                    </details>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <Action
            label={`Roll back ${id}`}
            testid="rollback"
            run={async () => {
              const a = await api('POST', `/rules/${encodeURIComponent(id)}/rollback`, { auth: true });
              onChange();
              view.refresh();
              return `published version ${a.version} (the body of an earlier version) at ${a.control_partition}:${a.control_offset}`;
            }}
          />
        </>
      )}
    </div>
  );
}

function Editor({ text, setText, onPublished }) {
  const [check, setCheck] = useState(() => validateRule(text));
  useEffect(() => setCheck(validateRule(text)), [text]);
  return (
    <div class="panel">
      <h2>Rule editor</h2>
      <p class="hint">
        Checked against <span class="mono">schemas/rule-v1.schema.json</span> as you type; the server checks it
        again with the rule engine before publishing it to the control topic. A new version must be above the
        applied one.
      </p>
      <textarea
        data-testid="rule-editor"
        spellcheck={false}
        rows={12}
        value={text}
        onInput={(e) => setText(e.currentTarget.value)}
      />
      {check.ok ? (
        <p class="ok" data-testid="rule-valid">
          valid against the schema
        </p>
      ) : (
        <ul class="error" data-testid="rule-errors">
          {check.errors.map((e) => (
            <li key={e}>{e}</li>
          ))}
        </ul>
      )}
      <Action
        label="Publish"
        testid="publish-rule"
        disabled={!check.ok}
        run={async () => {
          const a = await api('POST', '/rules', { auth: true, body: check.value });
          onPublished();
          return `published ${a.id} version ${a.version} at ${a.control_partition}:${a.control_offset}; it shows above once applied`;
        }}
      />
    </div>
  );
}
