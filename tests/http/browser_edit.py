"""dray serve's page in a real headless browser:

    browser_edit.py URL TOKEN IMAGE SCREENSHOT

uploads IMAGE, submits an instruction, waits for the edited image and
checks that it is a decoded PNG of the server's size, with the steps shown;
screenshots the page to SCREENSHOT; then checks that a refusal (a wrong
token) is shown with its request id. Exits 1 on the first failure."""
import re
import sys

from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from browser import check, chromium

url, token, image, screenshot = sys.argv[1:]
driver = chromium()
try:
    driver.get(url)
    check(driver.title == "dray: edit an image", "the page loads")
    field = lambda name: driver.find_element(By.ID, name)
    field("images").send_keys(image)
    field("prompt").send_keys("make it purple")
    field("seed").send_keys("3")
    field("token").clear()
    field("token").send_keys(token)
    field("submit").click()
    WebDriverWait(driver, 120).until(lambda d: d.find_elements(By.ID, "edited"))
    edited = driver.execute_async_script("""
        const done = arguments[arguments.length - 1];
        const img = document.getElementById("edited"), progress = document.getElementById("progress");
        img.decode().then(() => done({
          width: img.naturalWidth, height: img.naturalHeight,
          png: img.src.startsWith("data:image/png;base64,iVBORw0KGgo"),
          steps: progress.max, done: progress.value, caption: img.parentElement.textContent}));""")
    check(edited["png"], "the result is a PNG")
    check(edited["width"] == 64 and edited["height"] == 64,
          f"decoded at the server's size ({edited['width']}x{edited['height']})")
    check(edited["steps"] == 2 and edited["done"] == 2,
          f"the progress reached step {edited['done']} of {edited['steps']}")
    check("seed 3" in edited["caption"], f"the caption names the seed ({edited['caption']})")
    driver.save_screenshot(screenshot)

    field("token").clear()
    field("token").send_keys("wrong")
    field("submit").click()
    WebDriverWait(driver, 60).until(lambda d: "(request " in field("error").text)
    error = field("error").text
    check(re.search(r"client token[\s\S]*\(request [0-9a-f]{16}\)", error),
          f"a refusal is shown with its request id ({error})")
    check(not driver.find_elements(By.ID, "edited"), "and no stale result")
finally:
    driver.quit()
