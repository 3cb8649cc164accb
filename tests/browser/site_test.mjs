// Browser test of the built docs site (headless Debian chromium via playwright-core).
//
//   node tests/browser/site_test.mjs [SITE_DIR]   (default build/docs/site, built by tools/docs-check site)
//
// Serves SITE_DIR on 127.0.0.1 (a free port), then checks: every nav page renders without
// console errors; the getting-started loop block is on the page and equals its source in
// docs/getting-started.md; the search UI finds "gradient_accumulation_steps"; the C++ API
// reference is pages of the site (Engine's from the nav, in the site's theme, its
// "Used in" links leading to blocks that call Engine::backward); the search finds public
// symbols at their reference entries; no internal link (or
// #anchor) is broken; every C++ block of every guide page (in tabs and taller than the
// window too) has a copy button that copies the block's complete program, the same text
// its "Complete program" box shows. Saves screenshots of getting-started and
// api/engine.html, and the copies
// as a reader got them (copies.json: page, id, kind, copy text, expected output block,
// tolerance, expected diagnostic) for snippets/copies_test.py, in $STEPWISE_ARTIFACTS
// (default build/artifacts/).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';

const root = path.resolve(path.dirname(new URL(import.meta.url).pathname), '..', '..');
const siteDir = path.resolve(process.argv[2] || path.join(root, 'build', 'docs', 'site'));
const artifacts = path.resolve(process.env.STEPWISE_ARTIFACTS || path.join(root, 'build', 'artifacts'));
const failures = [];
// Each line says when it was reached, so that a slow check shows where the time goes.
const started = Date.now();
const at = () => `[${((Date.now() - started) / 1000).toFixed(1).padStart(5)} s]`;
const fail = (msg) => { failures.push(msg); console.log(`FAIL ${at()} ${msg}`); };
const pass = (msg) => console.log(`ok   ${at()} ${msg}`);

const types = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css', '.json': 'application/json',
  '.svg': 'image/svg+xml', '.png': 'image/png', '.inv': 'application/octet-stream', '.txt': 'text/plain' };
function serve(dir) {
  const server = http.createServer((req, res) => {
    const url = decodeURIComponent(new URL(req.url, 'http://x').pathname);
    let file = path.join(dir, url);
    if (!file.startsWith(dir)) { res.writeHead(403).end(); return; }
    if (fs.existsSync(file) && fs.statSync(file).isDirectory()) file = path.join(file, 'index.html');
    if (!fs.existsSync(file)) { res.writeHead(404).end('not found'); return; }
    res.writeHead(200, { 'Content-Type': types[path.extname(file)] || 'application/octet-stream' });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

function sourceOf(page, id) {
  const blocks = JSON.parse(execFileSync('/usr/bin/python3', [path.join(root, 'snippets', 'blocks.py'), '--json',
    path.join(root, page)], { encoding: 'utf8' }));
  const block = blocks.find((b) => b.id === id);
  if (!block) throw new Error(`no block #${id} in ${page}`);
  return block.shown;
}

// Clicks the copy button of every C++ block of `urls` as a reader would (showing its tab
// first), reads the clipboard, and checks it against the block's "Complete program" box
// (or, without one, the code shown). Writes what it copied to artifacts/copies.json.
async function copyButtons(browser, page, urls, base) {
  await browser.grantPermissions(['clipboard-read', 'clipboard-write'], { origin: base.replace(/\/$/, '') });
  const viewport = page.viewportSize();
  const copies = [];
  let tabbed = 0; let tall = 0;
  for (const url of urls) {
    await page.goto(url, { waitUntil: 'load' });
    // Material's transitions (the copy button fading in on hover, the box opening) make
    // each action wait for the element to stop moving: off here, the text is the same.
    await page.addStyleTag({ content: '*, *::before, *::after { transition: none !important; animation: none !important; }' });
    const where = url.slice(base.length);
    const ids = await page.$$eval('div.highlight[id^="snippet-"]', (ds) => ds.map((d) => d.id));
    for (const id of ids) {
      const block = page.locator(`#${id}`);
      const tabIndex = await block.evaluate((d) => {
        const tab = d.closest('.tabbed-block');
        return tab ? [[...document.querySelectorAll('.tabbed-set')].indexOf(tab.closest('.tabbed-set')),
          [...tab.parentElement.children].indexOf(tab)] : null;
      });
      if (tabIndex) {  // a reader clicks the tab first
        tabbed++;
        await page.locator('.tabbed-set').nth(tabIndex[0]).locator('.tabbed-labels > label').nth(tabIndex[1]).click();
      }
      // Material mounts a block's copy button when the block scrolls into view.
      await block.scrollIntoViewIfNeeded();
      await block.locator('button.md-clipboard').first().waitFor({ timeout: 5000 }).catch(() => {});
      const info = await block.evaluate((d) => {
        const box = d.nextElementSibling && d.nextElementSibling.matches('details.sw-complete') ? d.nextElementSibling : null;
        const out = [...document.querySelectorAll('div.sw-output[data-for]')].find((o) => o.dataset.for === d.id.slice(8));
        return {
          kind: d.dataset.kind, expect: d.dataset.expect || null,
          buttons: d.querySelectorAll('button.md-clipboard').length,
          shown: d.querySelector('code').textContent,
          box: box ? box.querySelector('code').textContent : null,
          output: out ? out.querySelector('code').textContent : null,
          tolerance: out ? out.dataset.tolerance : '', atol: out ? out.dataset.atol : '',
        };
      });
      const name = `${where}#${id.slice(8)}`;
      if (info.buttons !== 1) { fail(`${name}: ${info.buttons} copy buttons`); continue; }
      const box = await block.boundingBox();
      if (box && box.height > viewport.height) tall++;
      await page.evaluate(() => navigator.clipboard.writeText(''));
      await block.locator('button.md-clipboard').click();  // moves the mouse over it first, as a reader does
      const copied = await page.evaluate(() => navigator.clipboard.readText());
      const want = info.box !== null ? info.box : info.shown;
      if (copied !== want) { fail(`${name}: the copy button copied ${copied.length} characters, not the ${info.box !== null ? 'complete program' : 'code shown'} (${want.length})`); continue; }
      if (info.box !== null) {  // the toggle, opened, shows the same text
        const details = block.locator('xpath=following-sibling::details[1]');
        await details.locator('summary').click();
        const visible = await details.locator('code').innerText();
        await details.locator('summary').click();
        if (visible.replace(/\n$/, '') !== copied.replace(/\n$/, '')) { fail(`${name}: the "Complete program" box shows other text than the copy`); continue; }
      }
      copies.push({ page: where.replace(/\.html$/, ''), id: id.slice(8), kind: info.kind, expect: info.expect,
        copy: copied, output: info.output, tolerance: info.tolerance, atol: info.atol });
    }
  }
  fs.mkdirSync(artifacts, { recursive: true });
  fs.writeFileSync(path.join(artifacts, 'copies.json'), JSON.stringify(copies, null, 1));
  const byKind = {};
  for (const c of copies) byKind[c.kind] = (byKind[c.kind] || 0) + 1;
  if (copies.length < 30) fail(`copy buttons: only ${copies.length} C++ blocks copied`);
  else pass(`copy buttons: ${copies.length} C++ blocks (${Object.entries(byKind).map(([k, n]) => `${n} ${k}`).join(', ')}; `
    + `${tabbed} in tabs, ${tall} taller than the window) copy their complete program -> ${path.join(artifacts, 'copies.json')}`);
}

async function main() {
  if (!fs.existsSync(path.join(siteDir, 'index.html'))) throw new Error(`${siteDir}/index.html missing: build the site first`);
  const server = await serve(siteDir);
  const base = `http://127.0.0.1:${server.address().port}/`;
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'stepwise-chromium-'));
  // A fresh --user-data-dir (playwright passes `profile` as that flag).
  const browser = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  try {
    const page = await browser.newPage();
    let errors = [];
    page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
    page.on('pageerror', (e) => errors.push(String(e)));

    // 1. Every nav page renders without console errors.
    await page.goto(base + 'index.html');
    const nav = await page.$$eval('nav.md-nav--primary a.md-nav__link[href]', (as) => as.map((a) => a.href));
    const navPages = [...new Set(nav.map((h) => h.split('#')[0]))];
    if (navPages.length < 9) fail(`nav has only ${navPages.length} pages`);
    for (const url of navPages) {
      errors = [];
      const res = await page.goto(url, { waitUntil: 'load' });
      await page.waitForTimeout(100);
      const where = url.slice(base.length);
      if (!res || res.status() !== 200) fail(`nav page ${where}: HTTP ${res && res.status()}`);
      else if (errors.length) fail(`nav page ${where}: console errors: ${errors.join(' | ')}`);
      else pass(`nav page ${where}`);
    }

    // 2. The getting-started loop block is present and equals its source.
    await page.goto(base + 'getting-started.html');
    for (const id of ['loop-before', 'loop-after']) {
      const shown = await page.$eval(`#snippet-${id} code`, (c) => c.textContent).catch(() => null);
      const expected = sourceOf('docs/getting-started.md', id);
      if (shown === null) fail(`getting-started: block #${id} not on the page`);
      else if (shown.replace(/\n$/, '') !== expected) fail(`getting-started: block #${id} differs from its source`);
      else pass(`getting-started: block #${id} matches docs/getting-started.md`);
    }
    await page.click('label:has-text("After: stepwise")');
    fs.mkdirSync(artifacts, { recursive: true });
    await page.screenshot({ path: path.join(artifacts, 'getting-started.png'), fullPage: true });
    pass(`screenshot ${path.join(artifacts, 'getting-started.png')}`);

    // 2b. The home page's loop (the four pitfalls, in its comments) fits a 1,400-pixel-wide
    // window without scrolling sideways.
    await page.setViewportSize({ width: 1400, height: 900 });
    await page.goto(base + 'index.html');
    const overflow = await page.$eval('#snippet-at-a-glance code', (c) => c.scrollWidth - c.clientWidth)
      .catch(() => null);
    if (overflow === null) fail('index: block #at-a-glance not on the page');
    else if (overflow > 0) fail(`index: block #at-a-glance scrolls sideways by ${overflow} px at 1400 px`);
    else pass('index: block #at-a-glance fits a 1400-pixel-wide window');

    // 2c. The glossary's window timeline, drawn from its program's verified output: shown,
    // one column per output row (10 micro-batches and the flush), a step at each boundary
    // and at flush() (3), and no wider than the page's text column.
    await page.goto(base + 'glossary.html');
    const timeline = await page.$eval('svg.sw-timeline', (svg) => {
      const text = svg.closest('.md-content__inner');
      return {
        steps: svg.querySelectorAll('rect.sw-step').length,
        counted: svg.querySelectorAll('rect.sw-count').length,
        width: svg.getBoundingClientRect().width,
        room: text ? text.getBoundingClientRect().width : -1,
      };
    }).catch(() => null);
    if (timeline === null) fail('glossary: no window timeline (svg.sw-timeline)');
    else if (timeline.room < 0) fail('glossary: the timeline is not inside the page\'s text (.md-content__inner)');
    else if (timeline.steps !== 3 || timeline.counted !== 8) {
      fail(`glossary: the timeline shows ${timeline.steps} steps and ${timeline.counted} counted micro-batches, not 3 and 8`);
    } else if (timeline.width > timeline.room) {
      fail(`glossary: the timeline is ${timeline.width} px wide, wider than the page's ${timeline.room} px`);
    } else {
      await page.$eval('svg.sw-timeline', (svg) => svg.scrollIntoView());
      await page.screenshot({ path: path.join(artifacts, 'glossary-timeline.png'), fullPage: false });
      pass(`glossary: the window timeline (3 steps, 8 counted; screenshot ${path.join(artifacts, 'glossary-timeline.png')})`);
    }

    // 3. Search finds "gradient_accumulation_steps" through the search UI.
    await page.goto(base + 'index.html', { waitUntil: 'networkidle' });  // search index loaded
    await page.keyboard.press('/');   // Material's search shortcut, as a reader would
    await page.keyboard.type('gradient_accumulation_steps', { delay: 10 });
    try {
      await page.waitForSelector('.md-search-result__item', { timeout: 5000 }).catch(async () => {
        await page.fill('input.md-search__input', '');  // the worker was still indexing: type again
        await page.keyboard.type('gradient_accumulation_steps', { delay: 10 });
        await page.waitForSelector('.md-search-result__item', { timeout: 15000 });
      });
      const hits = await page.$$eval('.md-search-result__item a[href]', (as) => as.map((a) => a.href.split('#')[0]));
      const exact = [];
      for (const url of new Set(hits)) {
        if ((await (await fetch(url)).text()).includes('gradient_accumulation_steps')) exact.push(url.slice(base.length));
      }
      if (exact.length) pass(`search "gradient_accumulation_steps": found on ${exact.join(', ')}`);
      else fail('search "gradient_accumulation_steps": results, but none on a page with that word');
    } catch {
      fail('search "gradient_accumulation_steps": no results');
    }

    // 3b. A reader searching by symptom finds the troubleshooting page.
    for (const words of ['loss too small', 'weights differ', 'lr wrong']) {
      await page.fill('input.md-search__input', '');
      await page.keyboard.type(words, { delay: 10 });
      try {
        await page.waitForSelector('.md-search-result__item', { timeout: 15000 });
        const hits = await page.$$eval('.md-search-result__item a[href]', (as) => as.map((a) => a.href));
        if (hits.some((h) => h.includes('troubleshooting.html'))) pass(`search "${words}": troubleshooting`);
        else fail(`search "${words}": the troubleshooting page is not among ${hits.length} results`);
      } catch {
        fail(`search "${words}": no results`);
      }
    }

    // 4. The API reference is pages of this site: Engine's page is in the nav, in the
    // site's theme (Material's header and search, no Sphinx sidebar), Engine::backward's
    // entry is on it, and its "Used in" links lead to tested blocks that call backward().
    await page.goto(base + 'index.html');
    const apiLink = await page.$eval('nav.md-nav--primary a.md-nav__link[href$="api/engine.html"]', (a) => a.href)
      .catch(() => null);
    if (!apiLink) fail('API reference: no nav link to api/engine.html');
    else {
      await page.goto(apiLink, { waitUntil: 'load' });
      const backward = await page.$('[id^="_CPPv4N8stepwise6Engine8backward"]');
      const themed = await page.$('header.md-header input.md-search__input') !== null
        && await page.$('.sphinxsidebar') === null;
      if (!backward || !(await backward.isVisible())) fail('API reference: no Engine::backward entry on api/engine.html');
      else if (!themed) fail('API reference: api/engine.html is not in the site\'s theme (Material header and search)');
      else pass('API reference: Engine::backward on api/engine.html, in the site\'s theme, from the nav');
      await page.screenshot({ path: path.join(artifacts, 'api-engine.png'), fullPage: false });
      pass(`screenshot ${path.join(artifacts, 'api-engine.png')}`);
      const used = await page.$$eval('[id^="_CPPv4N8stepwise6Engine8backward"] + dd > .sw-used-in a[href]',
        (as) => as.map((a) => a.href));
      let good = 0;
      for (const href of used) {
        const [url, hash] = href.split('#');
        await page.goto(url, { waitUntil: 'load' });
        const code = await page.$eval(`div.highlight#${hash} code`, (c) => c.textContent).catch(() => null);
        if (code === null) fail(`API reference: "Used in" link ${href.slice(base.length)} leads to no code block`);
        else if (!/backward\s*\(/.test(code)) fail(`API reference: "Used in" block ${href.slice(base.length)} does not call backward()`);
        else good++;
      }
      if (used.length && good === used.length) pass(`API reference: Engine::backward's ${good} "Used in" links lead to blocks that call it`);
      else if (!used.length) fail('API reference: Engine::backward has no "Used in" links');
    }

    // 4b. The site's search finds public symbols, each leading to its reference entry.
    // [what a reader types, the entry it must find (page#id), the name the entry shows]
    const symbols = [
      ['global_grad_norm', 'engine.html#_CPPv4NK8stepwise6Engine16global_grad_normEv', 'global_grad_norm'],
      ['LossScalerOptions::hysteresis', 'loss_scaler.html#_CPPv4N8stepwise17LossScalerOptions11hysteresis_E', 'hysteresis'],
      ['ConfigError', 'errors.html#_CPPv4N8stepwise11ConfigErrorE', 'ConfigError'],
      ['load_window', 'checkpoint.html#_CPPv4N8stepwise11LoadOptions12load_window_E', 'load_window'],
      ['set_gradient_accumulation_boundary', 'engine.html#_CPPv4N8stepwise6Engine34set_gradient_accumulation_boundaryEb',
        'set_gradient_accumulation_boundary'],
      ['WarmupCosineLR', 'lr_schedules.html#_CPPv4N8stepwise14WarmupCosineLRE', 'WarmupCosineLR']];
    for (const [query, entryAt, symbol] of symbols) {
      await page.goto(base + 'index.html', { waitUntil: 'networkidle' });
      await page.keyboard.press('/');
      await page.keyboard.type(query, { delay: 5 });
      const want = `api/${entryAt}`;
      let hit = null;
      for (let attempt = 0; attempt < 3 && !hit; attempt++) {
        await page.waitForSelector('.md-search-result__item', { timeout: 5000 }).catch(() => {});
        // Material adds ?h=<query> (search.highlight) before the #anchor.
        const hrefs = await page.$$eval('.md-search-result a[href]', (as) => as.map((a) => a.href.replace(/\?[^#]*/, '')));
        hit = hrefs.find((h) => h.slice(base.length) === want) || null;
        if (!hit) {  // the worker may still be indexing: type again
          await page.fill('input.md-search__input', '');
          await page.keyboard.type(query, { delay: 5 });
        }
      }
      if (!hit) { fail(`search "${query}": no result at ${want}`); continue; }
      const [url, hash] = hit.split('#');
      await page.goto(url, { waitUntil: 'load' });
      const entry = await page.$eval(`[id="${decodeURIComponent(hash)}"]`, (e) => e.textContent).catch(() => null);
      if (entry === null) fail(`search "${query}": ${want} has no such entry`);
      else if (!entry.includes(symbol)) fail(`search "${query}": the entry at ${want} does not name ${symbol}`);
      else pass(`search "${query}": the reference entry ${want}`);
    }

    // 5. No broken internal link or anchor (every HTML page of the site, crawled).
    const seen = new Map(); // url -> Set of ids, or null if missing
    const queue = [base + 'index.html'];
    const links = [];
    while (queue.length) {
      const url = queue.shift();
      if (seen.has(url)) continue;
      const res = await fetch(url);
      if (!res.ok) { seen.set(url, null); continue; }
      const html = await res.text();
      seen.set(url, new Set([...html.matchAll(/\sid="([^"]+)"/g)].map((m) => m[1])));
      for (const m of html.matchAll(/\shref="([^"]+)"/g)) {
        const target = new URL(m[1].replace(/&amp;/g, '&'), url);
        if (target.origin !== new URL(base).origin) continue;
        const page = target.href.split('#')[0];
        links.push({ from: url, page, hash: decodeURIComponent(target.hash.slice(1)) });
        if (page.endsWith('.html') && !seen.has(page)) queue.push(page);
        else if (!page.endsWith('.html') && !seen.has(page)) seen.set(page, (await fetch(page)).ok ? new Set() : null);
      }
    }
    let broken = 0;
    for (const l of links) {
      const ids = seen.get(l.page);
      const bad = ids === null ? 'missing page' : (l.hash && l.page.endsWith('.html') && !ids.has(l.hash) ? `missing #${l.hash}` : '');
      if (bad && broken++ < 20) fail(`broken link in ${l.from.slice(base.length)}: ${l.page.slice(base.length)} (${bad})`);
    }
    if (!broken) pass(`internal links: ${links.length} links over ${seen.size} files, none broken`);

    // 6. Every C++ block's copy button copies its complete program (what the toggle shows).
    await copyButtons(browser, page, navPages.filter((u) => !u.includes('/api/')), base);
  } finally {
    await browser.close();
    server.close();
    fs.rmSync(profile, { recursive: true, force: true });
  }
  if (failures.length) {
    console.log(`\n${failures.length} browser check(s) failed`);
    process.exit(1);
  }
  console.log('\nall browser checks passed');
}

main().catch((e) => { console.error(e); process.exit(1); });
