# Colab set-up, hidden on the website. On Colab it installs attnbook from the
# book's repository; elsewhere (a local clone, the book build) it does nothing.
import importlib.util
import subprocess
import sys

REPO_URL = "https://github.com/attnbook/attention-masked-unmasked"
if "google.colab" in sys.modules and importlib.util.find_spec("attnbook") is None:
    url = f"attnbook[book] @ git+{REPO_URL}@main#subdirectory=code"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", url], check=True)
