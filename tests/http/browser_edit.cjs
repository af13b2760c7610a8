// dray serve's page in a real headless browser (Debian's Chromium, driven
// by playwright-core):
//   node browser_edit.cjs URL TOKEN IMAGE SCREENSHOT
// uploads IMAGE, submits an instruction, waits for the edited image and
// checks that it is a decoded PNG of the server's size, with the steps
// shown; screenshots the page to SCREENSHOT; then checks that a refusal (a
// wrong token) is shown with its request id. Exits 1 on the first failure.
const { chromium } = require("playwright-core");

const [url, token, imagePath, screenshot] = process.argv.slice(2);

function check(ok, what) {
  if (!ok) throw new Error(`FAIL: ${what}`);
  console.log(`ok: ${what}`);
}

async function main() {
  const browser = await chromium.launch({ executablePath: "/usr/bin/chromium", args: ["--no-sandbox"] });
  try {
    const page = await (await browser.newContext({ ignoreHTTPSErrors: true })).newPage();
    await page.goto(url);
    check((await page.title()) === "dray: edit an image", "the page loads");

    await page.setInputFiles("#images", imagePath);
    await page.fill("#prompt", "make it purple");
    await page.fill("#seed", "3");
    await page.fill("#token", token);
    await page.click("#submit");
    await page.waitForSelector("#edited", { timeout: 120000 });
    const edited = await page.evaluate(async () => {
      const img = document.getElementById("edited");
      await img.decode();
      const progress = document.getElementById("progress");
      return { width: img.naturalWidth, height: img.naturalHeight, png: img.src.startsWith("data:image/png;base64,iVBORw0KGgo"),
               steps: progress.max, done: progress.value, caption: img.parentElement.textContent };
    });
    check(edited.png, "the result is a PNG");
    check(edited.width === 64 && edited.height === 64, `decoded at the server's size (${edited.width}x${edited.height})`);
    check(edited.steps === 2 && edited.done === 2, `the progress reached step ${edited.done} of ${edited.steps}`);
    check(edited.caption.includes("seed 3"), `the caption names the seed (${edited.caption})`);
    await page.screenshot({ path: screenshot, fullPage: true });

    await page.fill("#token", "wrong");
    await page.click("#submit");
    await page.waitForFunction(() => document.getElementById("error").textContent.includes("(request "));
    const error = await page.textContent("#error");
    check(/client token[\s\S]*\(request [0-9a-f]{16}\)/.test(error), `a refusal is shown with its request id (${error})`);
    check((await page.$("#edited")) === null, "and no stale result");
  } finally {
    await browser.close();
  }
}

main().catch((error) => {
  console.error(error.message || error);
  process.exit(1);
});
