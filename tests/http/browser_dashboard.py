"""dray train's dashboard in a real headless browser, while the run trains:

    browser_dashboard.py URL SCREENSHOT

waits for the curves, the newest sample grid (decoded) and a checkpoint,
checks that the curves and the step shown move on as steps finish, and
screenshots the page to SCREENSHOT. Exits 1 on the first failure."""
import re
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from browser import check, chromium

SHOWN = """return {
    status: document.getElementById("status").textContent,
    curves: document.querySelectorAll("svg .curve").length,
    points: [...document.querySelectorAll("svg .curve")].map((p) => p.getAttribute("d").split("L").length),
    checkpoints: [...document.querySelectorAll("#checkpoints li")].map((li) => li.textContent)};"""

url, screenshot = sys.argv[1:]
driver = chromium()
try:
    driver.get(url)
    check(driver.title == "dray train", "the page loads")
    wait = WebDriverWait(driver, 120)
    shown = lambda: driver.execute_script(SHOWN)
    wait.until(lambda d: shown()["curves"] >= 3)
    wait.until(lambda d: d.find_element(By.ID, "sample").get_attribute("hidden") is None)
    sample = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const img = document.getElementById("sample");
        img.decode().then(() => done({width: img.naturalWidth, src: img.getAttribute("src")}));""")
    check(sample["width"] > 0 and re.fullmatch(r"samples/step_\d+\.png", sample["src"]),
          f"the newest samples show ({sample['src']})")
    wait.until(lambda d: re.fullmatch(r"step_\d+", shown()["checkpoints"][0]))
    before = shown()
    check(re.match(r"step \d+ of 200, reward [0-9.]+", before["status"]),
          f"the progress shows ({before['status']})")
    step = lambda status: int(re.match(r"step (\d+)", status).group(1))
    wait.until(lambda d: step(shown()["status"]) > step(before["status"]))
    after = shown()
    check(max(after["points"]) > max(before["points"]),
          f"the curves grow as steps finish ({before['status']} -> {after['status']})")
    check("total_steps: 200" in driver.execute_script(
        "return document.getElementById('config').textContent"), "the configuration shows")
    driver.save_screenshot(screenshot)
finally:
    driver.quit()
