// Keeps the console's Overview open in headless Chromium for a while, polling as a person's
// tab would (one /metrics scrape a second, /instance and /readyz every few seconds), for
// the benchmark row "throughput with the console open": run it beside a throughput run
// and compare with the same run without it. It measures nothing itself.
//
//   node integration-tests/console/hold-open.mjs http://127.0.0.1:9464 120   # seconds
import { createRequire } from 'node:module';

const require = createRequire(new URL('../../web/package.json', import.meta.url));
const { chromium } = require('playwright-core');

const [url = 'http://127.0.0.1:9464', seconds = '60'] = process.argv.slice(2);
const browser = await chromium.launch({
  executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
  args: ['--no-sandbox', '--disable-dev-shm-usage'],
});
try {
  const page = await browser.newPage();
  let scrapes = 0;
  page.on('requestfinished', (r) => new URL(r.url()).pathname === '/metrics' && scrapes++);
  await page.goto(`${url}/#/overview`);
  // The benchmark starts measuring at this line; SIGTERM ends the hold early.
  console.log(`console open on ${url}`);
  const stopped = new Promise((resolve) => process.once('SIGTERM', resolve));
  await Promise.race([page.waitForTimeout(Number(seconds) * 1000), stopped]);
  console.log(`console closed on ${url}: ${scrapes} /metrics scrapes`);
} finally {
  await browser.close();
}
