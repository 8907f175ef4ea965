// The console in a real browser (Debian's Chromium driven by playwright-core) against a
// running instance on the real broker; started by integration-tests/console.rs, which
// sets the environment below and checks the exit status. Exits 0 only if every step
// passed; each wait has a deadline and says what it waited for.
//
//   CONSOLE_URL       http://127.0.0.1:<admin port>
//   CONSOLE_TOKEN     the instance's admin token
//   CONSOLE_KEY       a key whose state the reference model knows
//   CONSOLE_EXPECTED  the count the model expects for it
//   CONSOLE_RULE_ID   id of the rule to publish through the editor
//   CONSOLE_SHOTS     directory for the screenshots (docs/)
//   CHROMIUM          browser binary (default /usr/bin/chromium)
import { createRequire } from 'node:module';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';

// playwright-core is a dev dependency of web/ (npm ci there); it never downloads browsers.
const require = createRequire(new URL('../../web/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const env = (k) => {
  const v = process.env[k];
  if (!v) throw new Error(`${k} is not set`);
  return v;
};
const url = env('CONSOLE_URL');
const tok = env('CONSOLE_TOKEN');
const key = env('CONSOLE_KEY');
const expected = Number(env('CONSOLE_EXPECTED'));
const ruleId = env('CONSOLE_RULE_ID');
const shots = env('CONSOLE_SHOTS');
const BUDGET = 200 * 1024;

let step = 'start';
const log = (...a) => console.log(`[console.spec] ${step}:`, ...a);

async function until(what, fn, timeoutMs = 30000) {
  const end = Date.now() + timeoutMs;
  let last;
  while (Date.now() < end) {
    try {
      const v = await fn();
      if (v) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${last ? ` (last error: ${last.message})` : ''}`);
}

function check(cond, message) {
  if (!cond) throw new Error(message);
}

const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
let failed = false;
try {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  const problems = [];
  page.on('pageerror', (e) => problems.push(`page error: ${e.message}`));
  page.on('console', (m) => {
    if (m.type() === 'error' && !/401|409|Failed to load resource/.test(m.text())) problems.push(`console error: ${m.text()}`);
    if (/Content Security Policy/i.test(m.text())) problems.push(`CSP violation: ${m.text()}`);
  });
  const shot = async (name) => {
    mkdirSync(shots, { recursive: true });
    await page.screenshot({ path: join(shots, `console-${name}.png`) });
    log(`screenshot docs/console-${name}.png`);
  };

  // ---- load: what GET / pulls in, compressed, under the budget; nothing from elsewhere
  step = 'load';
  const loaded = [];
  page.on('requestfinished', async (req) => {
    const u = new URL(req.url());
    if (u.pathname === '/' || u.pathname.startsWith('/assets/')) {
      const sizes = await req.sizes();
      const resp = await req.response();
      loaded.push({
        path: u.pathname,
        origin: u.origin,
        bytes: sizes.responseBodySize + sizes.responseHeadersSize,
        body: sizes.responseBodySize,
        encoding: resp && (await resp.headerValue('content-encoding')),
        csp: resp && (await resp.headerValue('content-security-policy')),
      });
    }
  });
  page.on('request', (req) => {
    if (!req.url().startsWith(url) && !req.url().startsWith('data:')) problems.push(`request to another origin: ${req.url()}`);
  });
  await page.goto(url, { waitUntil: 'load' });
  await until('the page and its assets', () => loaded.some((l) => l.path.endsWith('.js')) && loaded.some((l) => l.path.endsWith('.css')));
  const bytes = loaded.reduce((a, l) => a + l.bytes, 0);
  log(`loaded ${loaded.map((l) => `${l.path} ${l.body} B (${l.encoding || 'identity'})`).join(', ')}; ${bytes} B transferred with headers`);
  check(bytes < BUDGET, `console load is ${bytes} B, over the ${BUDGET} B budget`);
  check(loaded.every((l) => l.encoding === 'gzip'), 'every console file should be sent gzip-compressed');
  const doc = loaded.find((l) => l.path === '/');
  check(doc && /script-src 'self'/.test(doc.csp) && !/unsafe/.test(doc.csp), `strict CSP expected, got ${doc && doc.csp}`);
  console.log(`CONSOLE_LOAD_BYTES=${bytes}`);

  // ---- overview: throughput rising while the test's producer runs
  step = 'overview';
  const consumed = async () => Number((await page.getByTestId('consumed-total').innerText()).replace(/[^\d]/g, '') || 0);
  const first = await until('a consumed total', async () => (await consumed()) || false);
  await until('records in per second above 0', async () => Number((await page.getByTestId('rate-in').innerText()).replace(/,/g, '')) > 0);
  const later = await until('the consumed total rising', async () => {
    const n = await consumed();
    return n > first && n;
  });
  log(`consumed ${first} -> ${later}`);
  await until('readiness shown as ready', async () => (await page.getByTestId('ready').innerText()) === 'ready');
  await until('owned partitions shown', async () => /key groups 0–3/.test(await page.getByTestId('owned').innerText()));
  // Ten seconds of samples make the charts readable in the screenshot.
  await page.waitForTimeout(10000);
  check((await consumed()) > later, 'the consumed total should keep rising while input flows');
  await shot('overview');

  // ---- checkpoints: refused without the token, then taken with it and in the history
  step = 'checkpoints';
  await page.getByTestId('nav-checkpoints').click();
  await until('the history table', async () => (await page.locator('[data-testid=checkpoint-history] tbody tr').count()) > 0);
  await page.getByTestId('trigger-checkpoint').click();
  const refused = await until('the refusal', async () => {
    const el = page.getByTestId('trigger-checkpoint-result');
    return (await el.count()) && (await el.innerText());
  });
  check(/401/.test(refused) && (await page.getByTestId('trigger-checkpoint-result').getAttribute('class')) === 'error', `expected a 401 refusal, got: ${refused}`);
  log(`without token: ${refused}`);
  await page.getByTestId('token-input').fill(tok);
  await page.getByTestId('token-use').click();
  await until('the token to be kept', () => page.getByTestId('token-set').isVisible());
  check((await page.evaluate(() => localStorage.length)) === 0, 'the token must not be in localStorage');
  check((await page.evaluate(() => sessionStorage.getItem('streamstate.token'))) === tok, 'the token should be in sessionStorage');
  await page.getByTestId('trigger-checkpoint').click();
  const done = await until('the checkpoint to complete', async () => {
    const t = await page.getByTestId('trigger-checkpoint-result').innerText();
    return /completed/.test(t) && t;
  });
  const name = /chk-\d+-\w+/.exec(done)[0];
  log(done);
  const manual = page.locator('[data-testid=checkpoint-history] tbody tr[data-trigger=manual]', { hasText: name });
  await until(`${name} in the history as a manual checkpoint`, async () =>
    (await manual.count()) === 1 && /completed/.test(await manual.innerText()));
  const phases = await manual.getByTestId('checkpoint-phases').innerText();
  check(/^snapshot [\d.]+ m?s · flush [\d.]+ m?s · upload [\d.]+ m?s \(materialize [\d.]+ m?s\) · commit [\d.]+ m?s$/.test(phases),
    `expected the checkpoint's four phases, the upload's materialize part inside it, got: ${phases}`);
  log(`${name} phases: ${phases}`);
  await until('the duration and size chart', async () => (await page.locator('[data-testid=chart-checkpoints] canvas').count()) > 0);
  await shot('checkpoints');

  // ---- rules: the editor refuses what the schema refuses, publishes what it accepts
  step = 'rules';
  await page.getByTestId('nav-rules').click();
  const editor = page.getByTestId('rule-editor');
  await editor.fill(JSON.stringify({ id: ruleId, version: 1, kind: 'aggregate', aggregate: { fn: 'count', emit: 'every_event' }, colour: 'red' }));
  await until('a schema error', async () => /colour|additional/i.test(await page.getByTestId('rule-errors').innerText()));
  check(await page.getByTestId('publish-rule').isDisabled(), 'publish must be disabled while the rule is invalid');
  const rule = {
    id: ruleId,
    version: 1,
    kind: 'aggregate',
    filter: { field: '/amount', gt: 50 },
    aggregate: { fn: 'count', emit: 'every_event' },
  };
  await editor.fill(JSON.stringify(rule, null, 2));
  await until('the rule to be valid', () => page.getByTestId('rule-valid').isVisible());
  await page.getByTestId('publish-rule').click();
  const published = await until('the publish to be answered', async () => {
    const el = page.getByTestId('publish-rule-result');
    return (await el.count()) && (await el.innerText());
  });
  check(/published/.test(published), `publish failed: ${published}`);
  log(published);
  const row = page.locator(`[data-testid=rules] tr[data-rule="${ruleId}"]`);
  await until(`${ruleId} listed as active, version 1`, async () =>
    (await row.count()) === 1 &&
    (await row.getByTestId('rule-status').innerText()) === 'active' &&
    (await row.getByTestId('rule-version').innerText()) === '1',
  );
  // Its counts (this job's function is the count function, so the rule is listed and
  // counted, never evaluated: both stay 0 here; rule_ops.rs checks the counting).
  for (const id of ['rule-matches', 'rule-outputs']) {
    const t = await row.getByTestId(id).innerText();
    check(/^\d[\d,]*$/.test(t), `the rule's ${id} column should show a count, got: ${t}`);
  }
  await row.getByRole('button', { name: 'History' }).click();
  await until('its history', async () => /History of/.test(await page.getByTestId('rule-history').innerText()));
  await page.evaluate(() => scrollTo(0, 0));
  await shot('rules');

  // ---- state: the key's value as the reference model expects it
  step = 'state';
  await page.getByTestId('nav-state').click();
  await page.getByTestId('state-key').fill(key);
  await page.getByTestId('state-lookup').click();
  const text = await until('the state of the key', async () => {
    const el = page.getByTestId('state-result');
    return (await el.count()) && (await el.innerText());
  });
  check(text.includes(`Key ${key}`), `state shown for another key: ${text}`);
  check(new RegExp(`\\bvalue: ${expected}\\b`).test(text), `expected count ${expected} for ${key}, page shows:\n${text}`);
  log(`${key}: value ${expected} as the model expects`);
  await shot('state');

  // ---- transactions
  step = 'transactions';
  await page.getByTestId('nav-transactions').click();
  await until('the open transaction', async () => /\d/.test(await page.getByTestId('tx-age').innerText()));
  await shot('transactions');

  step = 'end';
  check(problems.length === 0, `browser reported:\n${problems.join('\n')}`);
  log('every step passed');
} catch (e) {
  failed = true;
  console.error(`[console.spec] FAILED at ${step}: ${e.stack || e}`);
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
