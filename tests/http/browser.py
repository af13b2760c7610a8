"""A headless browser for the HTTP tests: Debian's Chromium through
chromium-driver and Selenium (python3-selenium), the certificate of a
test's own authority accepted."""
from selenium import webdriver
from selenium.common.exceptions import SessionNotCreatedException
from selenium.webdriver.chrome.service import Service


def check(ok, what):
    """Prints `what` when `ok`; raises naming it otherwise."""
    if not ok:
        raise AssertionError(f"FAIL: {what}")
    print(f"ok: {what}", flush=True)


def chromium(attempts=3):
    """A headless Chromium, 1000 x 900, started again if it dies before
    chromedriver reaches it ("session not created from chrome not
    reachable": Debian 13's Chromium, once in 9 starts here)."""
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--ignore-certificate-errors", "--window-size=1000,900"):
        options.add_argument(argument)
    for attempt in range(attempts):
        try:
            return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
        except SessionNotCreatedException as error:
            print(f"Chromium did not start ({attempt + 1} of {attempts}): {error.msg}", flush=True)
            if attempt + 1 == attempts:
                raise
