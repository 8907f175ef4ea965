// Calls to the admin API of the instance that served this page (same origin only: the
// server's connect-src 'self'). The bearer token the user pastes is kept in this tab's
// sessionStorage only and sent on the calls the server guards.

const TOKEN_KEY = 'streamstate.token';

export const token = {
  get: () => sessionStorage.getItem(TOKEN_KEY) || '',
  set: (t) => sessionStorage.setItem(TOKEN_KEY, t.trim()),
  clear: () => sessionStorage.removeItem(TOKEN_KEY),
};

export class ApiError extends Error {
  constructor(status, message, body) {
    super(message);
    this.status = status;
    this.body = body;
  }
}

/** JSON call; `auth` sends the token (guarded routes). Throws ApiError on non-2xx. */
export async function api(method, path, { body, auth = false } = {}) {
  const headers = { Accept: 'application/json' };
  if (body !== undefined) headers['Content-Type'] = 'application/json';
  const t = token.get();
  if (auth && t) headers.Authorization = `Bearer ${t}`;
  const r = await fetch(path, {
    method,
    headers,
    cache: 'no-store',
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let data = text;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    /* not JSON: keep the text */
  }
  if (!r.ok) {
    let message = (data && data.error) || `${r.status} ${r.statusText}`;
    if (r.status === 401) {
      message = t
        ? `refused (401): the server did not accept the token; paste the right one at the top`
        : `refused (401): this needs the admin token; paste it at the top`;
    }
    throw new ApiError(r.status, message, data);
  }
  return data;
}

/** `/metrics` as a map: name -> [{labels, value}]. */
export async function metrics() {
  const r = await fetch('/metrics', { cache: 'no-store' });
  if (!r.ok) throw new ApiError(r.status, `/metrics: ${r.status}`);
  return parseMetrics(await r.text());
}

const LINE = /^([A-Za-z_:][\w:]*)(?:\{(.*)\})?\s+(\S+)/;
const LABEL = /(\w+)="((?:[^"\\]|\\.)*)"/g;

export function parseMetrics(text) {
  const out = new Map();
  for (const line of text.split('\n')) {
    if (!line || line[0] === '#') continue;
    const m = LINE.exec(line);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || '').matchAll(LABEL)) labels[l[1]] = l[2];
    const value = Number(m[3]);
    if (!out.has(m[1])) out.set(m[1], []);
    out.get(m[1]).push({ labels, value });
  }
  return out;
}

/** Sum of a metric over the samples whose labels pass `keep`. */
export function total(m, name, keep = () => true) {
  return (m.get(name) || []).filter((s) => keep(s.labels)).reduce((a, s) => a + s.value, 0);
}

export function fmtBytes(n) {
  if (n == null) return '—';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) {
    n /= 1024;
    i++;
  }
  return `${i ? n.toFixed(1) : n} ${u[i]}`;
}

export function fmtMs(ms) {
  if (ms == null) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 120000) return `${(ms / 1000).toFixed(1)} s`;
  return `${Math.round(ms / 60000)} min`;
}

export function fmtTime(ms) {
  return ms ? new Date(ms).toLocaleTimeString() : '—';
}

export function fmtRate(n) {
  if (n == null || !isFinite(n)) return '—';
  return n >= 100 ? Math.round(n).toLocaleString() : n.toFixed(1);
}
