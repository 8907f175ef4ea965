/** JSON shown as a collapsible tree: objects and arrays open, leaves typed by colour. */
export function Tree({ value, name, depth = 0 }) {
  const label = name === undefined ? null : <span class="tree-key">{name}: </span>;
  if (value !== null && typeof value === 'object') {
    const entries = Array.isArray(value) ? value.map((v, i) => [i, v]) : Object.entries(value);
    const summary = Array.isArray(value) ? `[${entries.length}]` : `{${entries.length}}`;
    return (
      <details class="tree" open={depth < 6}>
        <summary>
          {label}
          <span class="tree-meta">{summary}</span>
        </summary>
        <ul>
          {entries.map(([k, v]) => (
            <li key={k}>
              <Tree value={v} name={k} depth={depth + 1} />
            </li>
          ))}
        </ul>
      </details>
    );
  }
  const kind = value === null ? 'null' : typeof value;
  return (
    <span class="tree-leaf">
      {label}
      <span class={`tree-${kind}`}>{JSON.stringify(value)}</span>
    </span>
  );
}
