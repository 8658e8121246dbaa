"""SBoN Explorer: Speculative Rejection run live next to Best-of-N (Sun et al., NeurIPS 2024).

`python app.py` serves it on http://127.0.0.1:7860 (GRADIO_SERVER_NAME / GRADIO_SERVER_PORT change
that). The page shows a recorded run at once; the default models start loading in the background
as soon as the app serves (the page says what is loading), so a replay never waits for one. The
pieces live in components/ and the algorithms in sbon/; this file lays out the page and wires the
events: `create_app()` builds the page, `main()` serves it. Importing this module does nothing else (no
thread, no model, no torch setting), so tests and tools build the page with their own stand-ins.
"""

from __future__ import annotations

import functools
import inspect
import logging
import sys
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator

try:  # ZeroGPU Spaces: `spaces` must come before torch (sbon/zerogpu.py); elsewhere it may be absent
    import spaces  # noqa: F401
except ImportError:
    pass

from components.decode_paths import check_forced_paths
from components.model_cache import MODELS, ModelCache, convert_in_background
from components.torch_thread import configure_threads
from sbon.models import DEFAULT_GENERATOR

if __name__ == "__main__":
    # On a fresh machine, start the one-time conversion of the embedded generator now, in a child
    # process, so it overlaps the seconds this process spends importing gradio and building the page.
    convert_in_background(DEFAULT_GENERATOR)

import gradio as gr  # noqa: E402
from gradio.components.plot import PlotData  # noqa: E402
from starlette.middleware import Middleware  # noqa: E402
from starlette.routing import Mount  # noqa: E402

import gradio_adapter  # noqa: E402

from components import instructions as instruction_choices  # noqa: E402
from components import page_text  # noqa: E402
from components.controls import (DEFAULTS, EXAMPLES, METHOD_KNOBS, SETTING_NAMES, UNDECIDED_CHOICES, RunSettings,  # noqa: E402
                                 api_parameter, generator_choices, method_choices, on_method, on_new_seed, on_prompt,
                                 reads, reward_choices, signal_labels)
from components.presenter import (CAPTION_FIT_JS, CSS, KEYS_JS, PRESENT_STEP_S, PRESENTER_JS, SCROLL_TO_LIVE_JS,  # noqa: E402
                                  VIEWPORT_JS, on_present, on_present_tick, on_presenter, on_timed, present_move)
from components.priority import serve_below_generation, start_generation  # noqa: E402
from components.replays import (GALLERY, PAGES, beside, gallery_markdown, on_gallery, on_open, on_page_export,  # noqa: E402
                                on_share, on_upload, open_link, show_recorded, warm_gallery)
from components.runs import (MODEL_STATUS_LOADING_S, RUN_OUTPUTS, Runs, after_stop, models_status,  # noqa: E402
                             on_model_timer, on_stop, start_loading_models)
from components.static_pages import PREFIX as PAGES_PREFIX  # noqa: E402
from components.scenarios import (on_scenario, on_scenario_prompt, on_settings_scenario, scenario_choices,  # noqa: E402
                                  scenario_of, scenario_prompt_choices)
from components.style import Look  # noqa: E402
from components.tuning import on_tune_upload, on_use_tuned  # noqa: E402
from components.updates import WARNING, FrozenFigure, Refused, Update  # noqa: E402
from components.views import (CORRELATION_NOTE, NO_RUN, SHOWN, on_decision_point, on_pick, on_play,  # noqa: E402
                              on_row_select, on_tradeoff_kind)
from sbon.analysis.comparison import Comparison  # noqa: E402
from sbon.config import FIRST_DECISION_TOKENS  # noqa: E402
from sbon.errors import SBoNError  # noqa: E402
from sbon.zerogpu import GPU, gpu_duration, load_before_launch  # noqa: E402

log = logging.getLogger("sbon.app")

# The queue: one generation at a time (the Run button and the API share it), up to 8 light events
# (replays, uploads, selections) at once beside it, at most QUEUE_SIZE waiting before new ones are refused.
GENERATION = "generation"  # the concurrency group of the generation slot
GENERATION_SLOTS = 1
LIGHT_EVENTS = 8
QUEUE_SIZE = 64
DOCS = Path(__file__).resolve().parent / "docs"  # served beside the page: the notes link to it (page_text.DOCS_URL)


# -- the run on the device and the /compare API ----------------------------------------------------

@GPU(duration=gpu_duration)
def comparison_on_gpu(settings: RunSettings) -> Iterator:
    """The comparison's events for these settings (Best-of-N memory-bound or in memory, as asked). On a
    ZeroGPU Space this runs on a lent GPU in a worker process: settings in, plain events out, the models
    from the cache the worker inherits (sbon/zerogpu.py)."""
    yield from comparison_with(MODELS, settings)


def comparison_with(models: ModelCache, settings: RunSettings) -> Iterator:
    """The comparison's events for these settings, with the models from `models` (ModelCache.comparison)."""
    yield from models.comparison(settings)


def compare_endpoint(runs: Runs) -> Callable[..., str]:
    """The `/compare` API: a typed signature (gr.api reads it) over `runs`, the generation slot it shares."""
    def compare(prompt: str, n: int = DEFAULTS.n, method: str = DEFAULTS.method, alpha: float = DEFAULTS.alpha,
                tau: int = DEFAULTS.tau, kv_budget: int = 0, first_decision: int = 0,
                prune_by: str = DEFAULTS.prune_by, undecided: str = DEFAULTS.undecided,
                max_new_tokens: int = DEFAULTS.max_new_tokens,
                temperature: float = DEFAULTS.temperature, top_p: float = DEFAULTS.top_p, seed: int = DEFAULTS.seed,
                generator: str = DEFAULTS.generator, reward: str = DEFAULTS.reward,
                bon_same_memory: bool = DEFAULTS.bon_same_memory, instructions: str = "") -> str:
        """Run Speculative Rejection and Best-of-N on one prompt with the same seed; return the
        comparison as JSON (load it with sbon.analysis.comparison.Comparison.from_json)."""
        # every argument, by the RunSettings field it sets (locals() also holds the enclosing `runs`)
        given = {name: value for name, value in locals().items() if name != "runs"}
        try:
            return runs.compare(RunSettings.from_inputs(**given))
        except SBoNError as e:  # the caller's settings: one line in the server's log, not a traceback
            log.info("/compare refused: %s", e)
            raise gr.Error(str(e), print_exception=False) from None
    return compare


# -- the one converter: the handlers' plain records as Gradio takes them ------------------------------

def gradio_value(value: Any) -> Any:
    """A value for a page element: an Update as Gradio's update, a frozen figure as the plot's own data."""
    if isinstance(value, Update):
        return gr.update(**value.given())
    if isinstance(value, FrozenFigure):
        return PlotData(type="plotly", plot=value.json)
    return value


def for_gradio(handler: Callable, element: Callable[[str], Any] = lambda name: name) -> Callable:
    """`handler` as Gradio calls it: each {name: value} it returns (or yields) keyed by `element(name)`, its
    values converted (`gradio_value`), its notice shown as a toast, and a refusal as Gradio's error dialog.
    An update that names no element changes nothing (Gradio would take an empty dict for a value)."""
    def convert(update: dict[str, Any]) -> dict:
        if WARNING in update:
            gr.Warning(update[WARNING])
        values = {element(name): gradio_value(value) for name, value in update.items() if name != WARNING}
        return values or gr.skip()

    def refused(e: Refused) -> gr.Error:
        # titled as what it is (not an "Error": nothing went wrong), and no traceback in the server's log
        return gr.Error(str(e), title="Not now", print_exception=False,
                        **({} if e.duration_s is None else {"duration": e.duration_s}))

    if inspect.isgeneratorfunction(handler):
        @functools.wraps(handler)
        def stream(*args):
            try:
                for update in handler(*args):
                    yield convert(update)
            except Refused as e:
                raise refused(e) from None
        return stream

    @functools.wraps(handler)
    def call(*args):
        try:
            return convert(handler(*args))
        except Refused as e:
            raise refused(e) from None
    return call


def page_address(request: gr.Request | None) -> str | None:
    """The address of the page that sent ``request`` (its referer), or None."""
    return request.headers.get("referer") if request else None


def on_page_open(kind: str, viewport: dict | None, request: gr.Request) -> dict[str, Any]:
    """The page's open, with its query parameters (components.replays.on_open), and the Python client's example
    with the address the page was opened at."""
    page = page_address(request)
    return {**on_open(kind, viewport, dict(getattr(request, "query_params", None) or {})),
            **({"api_doc": page_text.api_doc(beside(page, ""))} if page else {})}


def on_share_click(comp: Comparison | None, request: gr.Request) -> dict[str, Any]:
    """Share, with the address of the page that asks (components.replays.on_share)."""
    return on_share(comp, page_address(request))


def on_row_selected(comp: Comparison | None, evt: gr.SelectData) -> dict[str, Any]:
    """A table row's selection as the row it holds (components.views.on_row_select)."""
    return on_row_select(comp, evt.row_value)



# -- the page: one builder per section, each adding its elements to `ui` by the names the handlers use ---

def create_app(models: ModelCache = MODELS, threads: int | None = None, runs: Runs | None = None) -> gr.Blocks:
    """The page, wired: `models` the cache its runs and its model line use, `threads` torch's CPU threads (shown
    beside the device), `runs` the generation slot (a fresh one over `models` by default; tests pass their own).
    Builds only: nothing loads, no thread starts, no torch setting changes (main() does those)."""
    if runs is None:
        runs = Runs(comparison_on_gpu if models is MODELS else functools.partial(comparison_with, models))
    gr.set_static_paths(paths=[DOCS])  # the docs the page links to (page_text.REWARD_NOTE)
    ui = SimpleNamespace()
    # delete_cache: Gradio's copies of downloads and uploads go after a day.
    with gr.Blocks(title="SBoN Explorer", analytics_enabled=False, delete_cache=(3600, 86400)) as demo:
        build_header(ui)
        build_run_bar(ui)
        with gr.Row(elem_id="main-row"):
            with gr.Column(scale=2, min_width=320, elem_id="settings-column"):
                build_prompt_inputs(ui)
                build_method_knobs(ui)
                build_models_block(ui, models, threads)
            with gr.Column(scale=3, elem_id="live-column"):
                build_live_column(ui)
        with gr.Tabs(overflow_behavior="wrap"):  # every tab in sight, on a phone and a projector too
            for build_tab in TABS:
                build_tab(ui)
        runs.waiting = functools.partial(gradio_adapter.waiting_in, demo, GENERATION)
        wire(ui, demo, runs)
    return demo


def build_header(ui: SimpleNamespace) -> None:
    """The session's state (never shared between sessions), the introduction and the note on the default reward."""
    ui.comparison = gr.State(None)  # this session's Comparison
    ui.origin = gr.State(None)  # where it came from ("your run", "the recorded run …")
    ui.running = gr.State(None)  # when this session's run was requested; None when none is going
    ui.look = gr.State(Look())  # the page's view or the presenter view, and the window's size
    ui.present = gr.State(None)  # the step "Present rounds" shows; None when not presenting, LIVE while a run draws
    ui.viewport = gr.JSON(visible=False)  # the window's size, filled in by the browser (VIEWPORT_JS)
    gr.Markdown(page_text.INTRO, elem_id="intro")
    with gr.Accordion(page_text.REWARD_TITLE, open=False, elem_id="reward-accordion"):
        gr.Markdown(page_text.REWARD_NOTE, elem_id="reward-note")


def build_run_bar(ui: SimpleNamespace) -> None:
    """The run bar: sticky (see CSS), so Run, Stop and the race stay beside the live plot."""
    with gr.Row(elem_id="run-bar", equal_height=True):
        ui.run_btn = gr.Button("▶ Run", variant="primary", elem_id="run", scale=0, min_width=90)
        ui.stop_btn = gr.Button("■ Stop", variant="stop", visible=False, elem_id="stop", scale=0, min_width=80)
        ui.seed = gr.Number(DEFAULTS.seed, label="seed", show_label=False, precision=0, elem_id="seed", scale=0,
                            min_width=140, container=False)
        ui.new_seed = gr.Button("↻ New seed", elem_id="new-seed", scale=0, min_width=110)
        ui.present_btn = gr.Button("▶ Present rounds", elem_id="present-rounds", scale=0, min_width=150)
        ui.present_prev = gr.Button("◀", elem_id="present-prev", scale=0, min_width=50, visible=False)
        ui.present_next = gr.Button("▶", elem_id="present-next", scale=0, min_width=50, visible=False)
        ui.timed = gr.Checkbox(False, label="timed", elem_id="present-timed", scale=0, min_width=90, container=False)
        ui.present_timer = gr.Timer(PRESENT_STEP_S, active=False)
        # Clickable once the page has opened (on_page_open): its figures come in the look the URL asks for, and a
        # toggle before them would be undone by them.
        ui.presenter = gr.Checkbox(False, label="Presenter view", elem_id="presenter", scale=0, min_width=150,
                                   container=False, interactive=False)
        ui.status = gr.Markdown("", elem_id="status")


def build_prompt_inputs(ui: SimpleNamespace) -> None:
    """The settings column's top: the scenario, the prompt and its examples, the instructions to follow."""
    initial = scenario_of(DEFAULTS.reward, DEFAULTS.prune_by, DEFAULTS.max_new_tokens)
    ui.scenario = gr.Dropdown(scenario_choices(), value=initial, label="Scenario", elem_id="scenario",
                              info="a task and the reward that can judge it; sets the reward, the pruning "
                                   "signal and the answer length")
    ui.scenario_prompts = gr.Dropdown(scenario_prompt_choices(initial), value=None, label="Scenario prompts",
                                      info="pick one to put it in the Prompt box", elem_id="scenario-prompts")
    ui.prompt = gr.Textbox(label="Prompt", lines=3, elem_id="prompt", value=DEFAULTS.prompt)
    gr.Examples([[e.prompt] for e in EXAMPLES], inputs=[ui.prompt], label="Example prompts",
                example_labels=[e.label for e in EXAMPLES], examples_per_page=10)
    with gr.Accordion("Instructions the answer must follow (checked by the Follow instructions reward)", open=False,
                      elem_id="instructions-block"):
        ui.instruction_types = gr.Dropdown(instruction_choices.type_choices(), multiselect=True,
                                           label="Add an instruction", elem_id="instruction-types")
        ui.instructions_note = gr.Markdown(elem_id="instructions-note")
        with gr.Row():
            ui.clear_instructions = gr.Button("Clear the instructions", size="sm", scale=0, min_width=180,
                                              elem_id="clear-instructions")
        with gr.Accordion("Edit as JSON (IFEval's instruction ids and arguments)", open=False,
                          elem_id="instructions-json"):
            ui.instructions = gr.Textbox(label="The instructions as the reward takes them: change a number or a word, "
                                               "or remove a line", lines=3,
                                         placeholder=instruction_choices.PLACEHOLDER, elem_id="instructions")
    gr.Markdown(page_text.CONTENT_NOTE, elem_id="content-note")
    ui.prompt_note = gr.Markdown(visible=False, elem_id="prompt-note")


def build_method_knobs(ui: SimpleNamespace) -> None:
    """The method and its settings, the pruning signal, the Best-of-N baseline's memory."""
    ui.method = gr.Radio(method_choices(), value=DEFAULTS.method, label="Method", elem_id="method")
    # Numbers carry no minimum/maximum: RunSettings checks them, so a bad value gets our
    # one-line message instead of Gradio's generic preprocessing error.
    with gr.Row():
        ui.n = gr.Number(DEFAULTS.n, label="N (candidates)", precision=0, elem_id="n")
        ui.alpha = gr.Slider(0.0, 0.95, DEFAULTS.alpha, step=0.05, label="α (rejection rate)", elem_id="alpha")
    with gr.Row():
        ui.kv_budget = gr.Number(0, label="KV budget (tokens; 0 = N × (prompt + first decision))",
                                 precision=0, elem_id="kv-budget", visible=reads(DEFAULTS.method, "kv_budget"))
        ui.first_decision = gr.Number(0, label=f"first decision point (tokens; 0 = {FIRST_DECISION_TOKENS})",
                                      precision=0, elem_id="first-decision",
                                      visible=reads(DEFAULTS.method, "first_decision"))
        ui.tau = gr.Number(DEFAULTS.tau, label="τ (decision token)", precision=0,
                           visible=reads(DEFAULTS.method, "tau"), elem_id="tau")
        ui.max_new_tokens = gr.Number(DEFAULTS.max_new_tokens, label="max new tokens", precision=0,
                                      elem_id="max-new-tokens")
    ui.prune_by = gr.Dropdown(signal_labels(), value=DEFAULTS.prune_by, label="Pruning signal", elem_id="prune-by",
                              info="what ranks the candidates at a decision point; the final choice "
                                   "is always by the reward model")
    ui.undecided = gr.Dropdown(UNDECIDED_CHOICES, value=DEFAULTS.undecided, elem_id="undecided",
                               label="Candidates the score cannot tell apart from the cut",
                               info="when the pruning signal's own uncertainty says a candidate could be "
                                    "on either side of the cut")
    ui.bon_same_memory = gr.Checkbox(
        DEFAULTS.bon_same_memory, label="Best-of-N under the same memory", elem_id="bon-same-memory",
        info="run Best-of-N in batches that fit the KV cache Speculative Rejection peaked at, as in the "
             "paper; off: all N at once, with memory to spare (then only tokens, not time, are saved on a CPU)")


def build_models_block(ui: SimpleNamespace, models: ModelCache, threads: int | None) -> None:
    """The models and sampling, where the models run, and the line that says what is loaded."""
    with gr.Accordion("Models and sampling", open=False):
        ui.generator = gr.Dropdown(generator_choices(), value=DEFAULTS.generator, label="Generator",
                                   allow_custom_value=True, info="a preset, a local folder or a hub id")
        ui.reward = gr.Dropdown(reward_choices(), value=DEFAULTS.reward, label="Reward model", allow_custom_value=True)
        with gr.Row():
            ui.temperature = gr.Number(DEFAULTS.temperature, label="temperature")
            ui.top_p = gr.Number(DEFAULTS.top_p, label="top-p")
        gr.Markdown(page_text.models_note(models.device().type, threads))
    # What is loaded and loading, computed on every page load (a callable value) and
    # refreshed each second while something loads.
    ui.model_status = gr.Markdown(models_status, elem_id="model-status")
    ui.model_timer = gr.Timer(MODEL_STATUS_LOADING_S)


def build_live_column(ui: SimpleNamespace) -> None:
    """The live column: the round's caption, the decision points as they happen, the run's source and headline."""
    ui.caption = gr.Markdown(NO_RUN, elem_id="round-caption")
    ui.live_plot = gr.Plot(label="Decision points, live", elem_id="live-plot", show_label=False)
    ui.source = gr.Markdown(elem_id="run-source")
    ui.summary = gr.Markdown(elem_id="headline")


def build_scatter_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Partial vs final reward", id="scatter-tab", elem_id="scatter-tab"):
        ui.decision_point = gr.Dropdown(label="Decision point", choices=[], elem_id="decision-point")
        ui.scatter = gr.Plot(label="Partial vs final reward", elem_id="scatter", show_label=False)


def build_candidates_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Candidates", id="candidates-tab", elem_id="candidates-tab"):
        ui.table = gr.Dataframe(label="Every candidate (Speculative Rejection's run; final rewards of pruned ones from Best-of-N)",
                                interactive=False, wrap=False, max_height=420, elem_id="candidates-table")
        ui.picker = gr.Dropdown(label="Candidate", choices=[], elem_id="candidate-picker")
        ui.detail = gr.HTML(elem_id="candidate-detail")


def build_savings_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Savings", id="savings-tab", elem_id="savings-tab"):
        ui.savings = gr.Dataframe(interactive=False, wrap=True, column_widths=["40%", "30%", "30%"],
                                  elem_id="savings-table")
        ui.tokens_plot = gr.Plot(label="Tokens per candidate", elem_id="tokens-plot", show_label=False)
        ui.times_plot = gr.Plot(label="Wall time by phase", elem_id="times-plot", show_label=False)
        with gr.Row():
            ui.bon_text = gr.Textbox(label="Best-of-N returned", lines=8, interactive=False, elem_id="bon-text")
            ui.sbon_text = gr.Textbox(label="Speculative Rejection returned", lines=8, interactive=False,
                                      elem_id="sbon-text")


def build_rounds_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Rounds replay", id="rounds-tab", elem_id="rounds-tab"):
        ui.play_btn = gr.Button("▶ Play the rounds", size="sm", elem_id="play-rounds")
        ui.rounds_plot = gr.Plot(label="Rounds: drag the slider or press Play", elem_id="rounds-plot", show_label=False)


def build_tradeoff_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Trade-off", id="tradeoff-tab", elem_id="tradeoff-tab"):
        gr.Markdown(page_text.TRADEOFF_NOTE)
        ui.tradeoff_kind = gr.Radio(["curves", "heatmap"], value="curves", label="Show as", elem_id="tradeoff-kind")
        ui.tradeoff_plot = gr.Plot(label="Trade-off", elem_id="tradeoff-plot", show_label=False)
        ui.correlations = gr.Dataframe(label="Partial vs final reward of Best-of-N's candidates at each "
                                             "decision token τ", interactive=False, elem_id="correlations")
        gr.Markdown(CORRELATION_NOTE, elem_id="correlations-note")
        with gr.Accordion("Tuned settings for a model and reward", open=False):
            gr.Markdown("A tuning run on the command line (`python -m benchmarks tune`) finds the cheapest decision "
                        "point and α that keep the answer's quality; load the file it writes to use them here.")
            ui.tuning = gr.State(None)
            ui.tune_file = gr.File(label="Load a tuning result (tune.json)", file_types=[".json"],
                                   type="filepath", elem_id="tune-file")
            ui.tune_summary = gr.Markdown(elem_id="tune-summary")
            ui.tune_table = gr.Dataframe(interactive=False, elem_id="tune-table")
            ui.use_tuned = gr.Button("Use these settings", visible=False, size="sm", elem_id="use-tuned")


def build_signals_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Pruning signals", id="signals-tab", elem_id="signals-tab"):
        ui.signals_note = gr.Markdown(elem_id="signals-note")  # first: which rows are the run's, which a what-if
        ui.signals_summary = gr.Dataframe(label="Per signal and decision point: this run's cuts, then the what-ifs",
                                          interactive=False, elem_id="signals-summary")
        ui.signals_plot = gr.Plot(elem_id="signals-plot", show_label=False)
        ui.signals_candidates = gr.Dataframe(label="Candidates (✓ kept, ✗ pruned, · finished before the decision "
                                                   "point, – pruned earlier): click a row to open it under Candidates",
                                             interactive=False, elem_id="signals-candidates")


def build_gallery_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Gallery", id="gallery-tab", elem_id="gallery-tab"):
        gr.Markdown(page_text.GALLERY_NOTE)
        ui.gallery = gr.Radio(GALLERY.choices(), value=None, label="Gallery", elem_id="gallery")
        ui.gallery_list = gr.Markdown(gallery_markdown(), elem_id="gallery-list")
        ui.link_run = gr.Textbox(visible=False)  # a link's query; the load benchmark opens links through it


def build_replay_tab(ui: SimpleNamespace) -> None:
    with gr.Tab("Save and replay", id="replay-tab", elem_id="replay-tab"):
        with gr.Row():
            ui.download = gr.DownloadButton("Download this run (JSON)", elem_id="download")
            ui.replay_btn = gr.Button("Show the recorded run again", elem_id="replay-recorded")
        with gr.Row():
            ui.share_btn = gr.Button("Share this run", elem_id="share")
            ui.page_btn = gr.Button("Download as a page (HTML, opens without the app)", elem_id="page-export")
        ui.share_link = gr.Textbox(label="Link to this run", interactive=False, buttons=["copy"], elem_id="share-link")
        ui.page_file = gr.File(label="This run as a page", interactive=False, elem_id="page-file")
        ui.upload = gr.File(label="Replay a saved run (JSON): every view, no model needed", file_types=[".json"],
                            type="filepath", elem_id="upload-run")
        ui.api_doc = gr.Markdown(page_text.api_doc(), elem_id="api-doc")


TABS = (build_scatter_tab, build_candidates_tab, build_savings_tab, build_rounds_tab, build_tradeoff_tab,
        build_signals_tab, build_gallery_tab, build_replay_tab)  # in the page's order


# -- the wiring: the page's events to the handlers ----------------------------------------------------

PRIVATE = dict(api_visibility="private")  # the page's own events: not part of the API
# Opening the page, a gallery run or a link: light events beside the generation slot, callable by the load
# benchmark's clients (undocumented: not part of the API the page documents). They start at once (no
# concurrency limit): views are computed once and kept, so an open is mostly sending them, and a class
# arriving together never fills the queue that generations wait in.
LIGHT = dict(api_visibility="undocumented", concurrency_limit=None)


def el(ui: SimpleNamespace, *names: str) -> list:
    """The page's elements by name."""
    return [getattr(ui, name) for name in names]


def by_name(ui: SimpleNamespace, handler: Callable) -> Callable:
    """`handler` as Gradio calls it, its {element name: value} keyed by the page's elements (`for_gradio`)."""
    return for_gradio(handler, element=lambda name: getattr(ui, name))


def wire(ui: SimpleNamespace, demo: gr.Blocks, runs: Runs) -> None:
    """Connect the page's events to the handlers. Handlers return {element name: value} in plain data;
    `by_name` turns that into what Gradio takes (`for_gradio`)."""
    wire_run(ui, runs)
    wire_settings(ui)
    wire_views(ui)
    wire_presenter(ui)
    wire_replays(ui, demo)
    # The API shares the Run button's single generation slot: one generation at a time per device.
    compare = compare_endpoint(runs)
    gr.api(compare, api_name="compare", concurrency_limit=GENERATION_SLOTS, concurrency_id=GENERATION)
    gradio_adapter.describe_endpoint(demo, "compare", api_parameter, list(inspect.signature(compare).parameters),
                                     page_text.api_returns())


def wire_run(ui: SimpleNamespace, runs: Runs) -> None:
    """Run and Stop. Two steps: the request is answered at once (refused, queued or starting), then the run
    itself waits for the one generation slot."""
    request = ui.run_btn.click(by_name(ui, runs.request), inputs=el(ui, "running", "look", "viewport"),
                               outputs=el(ui, "running", "status", "caption", "stop_btn", "summary", "look"),
                               js=f"(running, look) => [running, look, ({VIEWPORT_JS})()]", concurrency_limit=None,
                               show_progress="hidden", **PRIVATE)
    run_event = request.success(by_name(ui, runs.run),
                                inputs=el(ui, *SETTING_NAMES, "tradeoff_kind", "comparison", "origin", "look", "running"),
                                outputs=el(ui, *RUN_OUTPUTS), concurrency_limit=GENERATION_SLOTS,
                                concurrency_id=GENERATION, show_progress="minimal", show_progress_on=ui.status,
                                **PRIVATE)
    ui.run_btn.click(None, js=SCROLL_TO_LIVE_JS)  # in the presenter view, the live chart comes into sight
    stop = ui.stop_btn.click(by_name(ui, on_stop), inputs=el(ui, "comparison", "origin"),
                             outputs=el(ui, "status", "caption", "running", "stop_btn", "source", "summary"),
                             cancels=[run_event], **PRIVATE)
    stop.then(by_name(ui, after_stop), inputs=el(ui, "comparison", "origin", "look"),
              outputs=el(ui, "status", "caption", "running", "stop_btn", "live_plot", "sbon_text", "bon_text",
                         "present", "present_prev", "present_next"), **PRIVATE)


def wire_settings(ui: SimpleNamespace) -> None:
    """The settings column: the seed, the method's knobs, the prompt's notes, scenarios and instructions, the
    models' line, a tuning file's settings."""
    ui.new_seed.click(on_new_seed, inputs=ui.seed, outputs=ui.seed, **PRIVATE)
    ui.method.change(by_name(ui, on_method), inputs=ui.method, outputs=el(ui, *METHOD_KNOBS), **PRIVATE)
    ui.prompt.change(by_name(ui, on_prompt), inputs=ui.prompt, outputs=ui.prompt_note, **PRIVATE)
    ui.prompt.change(by_name(ui, instruction_choices.on_prompt), inputs=el(ui, "prompt", "instructions"),
                     outputs=ui.instructions, **PRIVATE)
    # .input: the visitor's choice only, so the dropdown following the settings (below) sets nothing back.
    ui.scenario.input(by_name(ui, on_scenario), inputs=el(ui, "scenario", "prompt"),
                      outputs=el(ui, "reward", "prune_by", "max_new_tokens", "prompt", "scenario_prompts"), **PRIVATE)
    for control in el(ui, "reward", "prune_by", "max_new_tokens"):
        control.change(by_name(ui, on_settings_scenario), inputs=el(ui, "reward", "prune_by", "max_new_tokens"),
                       outputs=el(ui, "scenario", "scenario_prompts"), **PRIVATE)
    ui.scenario_prompts.change(by_name(ui, on_scenario_prompt), inputs=ui.scenario_prompts, outputs=ui.prompt,
                               **PRIVATE)
    ui.scenario_prompts.change(by_name(ui, instruction_choices.on_example), inputs=ui.scenario_prompts,
                               outputs=el(ui, "instructions", "instruction_types"), **PRIVATE)
    # Instructions given under another reward switch the run to the instruction reward; the note under them says
    # which reward checks them, or that the reward chosen since ignores them.
    ui.instruction_types.input(by_name(ui, instruction_choices.on_types),
                               inputs=el(ui, "instruction_types", "instructions", "reward"),
                               outputs=el(ui, "instructions", "instruction_types", "reward"), **PRIVATE)
    ui.instructions.input(by_name(ui, instruction_choices.on_typed), inputs=el(ui, "instructions", "reward"),
                          outputs=ui.reward, **PRIVATE)
    ui.clear_instructions.click(lambda: "", outputs=ui.instructions, **PRIVATE)
    for source in (ui.instructions, ui.reward):
        source.change(by_name(ui, instruction_choices.on_text), inputs=el(ui, "instructions", "reward"),
                      outputs=ui.instructions_note, **PRIVATE)
    ui.model_timer.tick(by_name(ui, on_model_timer), outputs=el(ui, "model_status", "model_timer"),
                        show_progress="hidden", **PRIVATE)
    ui.tune_file.upload(by_name(ui, on_tune_upload), inputs=ui.tune_file,
                        outputs=el(ui, "tuning", "tune_summary", "tune_table", "use_tuned"), **PRIVATE)
    ui.use_tuned.click(by_name(ui, on_use_tuned), inputs=ui.tuning,
                       outputs=el(ui, "method", "alpha", "tau", "prune_by", "n", "max_new_tokens", "first_decision"),
                       **PRIVATE)


def wire_views(ui: SimpleNamespace) -> None:
    """The views that redraw one part of a finished run: a decision point, a candidate, the rounds, the trade-off."""
    ui.decision_point.change(by_name(ui, on_decision_point), inputs=el(ui, "comparison", "decision_point", "look"),
                             outputs=el(ui, "scatter"), **PRIVATE)
    ui.picker.change(by_name(ui, on_pick), inputs=el(ui, "comparison", "picker"), outputs=el(ui, "detail"), **PRIVATE)
    for table in (ui.table, ui.signals_candidates):
        table.select(by_name(ui, on_row_selected), inputs=ui.comparison, outputs=el(ui, "picker", "detail"),
                     **PRIVATE)
    ui.play_btn.click(by_name(ui, on_play), inputs=el(ui, "comparison", "look"), outputs=el(ui, "rounds_plot"),
                      show_progress="hidden", **PRIVATE)
    ui.tradeoff_kind.change(by_name(ui, on_tradeoff_kind),
                            inputs=el(ui, "comparison", "tradeoff_kind", "look", "running"),
                            outputs=el(ui, "tradeoff_plot"), **PRIVATE)


def wire_presenter(ui: SimpleNamespace) -> None:
    """Present rounds (by hand or timed) and the presenter view."""
    presenting = el(ui, "present", "live_plot", "caption", "present_prev", "present_next")
    ui.present_btn.click(by_name(ui, on_present), inputs=el(ui, "comparison", "present", "look"), outputs=presenting,
                         show_progress="hidden", **PRIVATE)
    ui.present_btn.click(None, js=SCROLL_TO_LIVE_JS)
    for button, move in ((ui.present_prev, -1), (ui.present_next, 1)):
        button.click(by_name(ui, functools.partial(present_move, move=move)),
                     inputs=el(ui, "comparison", "present", "look"), outputs=presenting,
                     show_progress="hidden", **PRIVATE)
    ui.timed.change(by_name(ui, on_timed), inputs=ui.timed, outputs=el(ui, "present_timer"), **PRIVATE)
    ui.present_timer.tick(by_name(ui, on_present_tick), inputs=el(ui, "comparison", "present", "look"),
                          outputs=presenting, show_progress="hidden", **PRIVATE)
    ui.presenter.input(by_name(ui, on_presenter),
                       inputs=el(ui, "presenter", "viewport", "comparison", "origin", "tradeoff_kind", "running"),
                       outputs=el(ui, *SHOWN, "look"), js=f"(on, _, ...rest) => {{ ({PRESENTER_JS})(on); "
                                                          f"return [on, ({VIEWPORT_JS})(), ...rest]; }}",
                       show_progress="hidden", **PRIVATE)


def wire_replays(ui: SimpleNamespace, demo: gr.Blocks) -> None:
    """Every way a finished run reaches the page without generating (the page's open, a link, the gallery, an
    upload, the recorded run), and Share and Download as a page."""
    ui.upload.upload(by_name(ui, on_upload), inputs=el(ui, "upload", "tradeoff_kind", "look"), outputs=el(ui, *SHOWN),
                     **PRIVATE)
    ui.replay_btn.click(by_name(ui, show_recorded), inputs=el(ui, "tradeoff_kind", "look"), outputs=el(ui, *SHOWN),
                        **PRIVATE)
    # The page opens on the run its link names, in the view its URL names (the browser applies it before the
    # figures are drawn, and reports the window's size for them).
    demo.load(by_name(ui, on_page_open), inputs=el(ui, "tradeoff_kind", "viewport"),
              outputs=el(ui, *SHOWN, "look", "presenter", "api_doc", *SETTING_NAMES),
              js=f"(kind) => {{ ({PRESENTER_JS})(new URLSearchParams(window.location.search).get('view') == 'presenter'); "
                 f"return [kind, ({VIEWPORT_JS})()]; }}", show_progress="hidden", api_name="page_open", **LIGHT)
    demo.load(None, js=KEYS_JS)
    demo.load(None, js=CAPTION_FIT_JS)
    ui.gallery.change(by_name(ui, on_gallery), inputs=el(ui, "gallery", "tradeoff_kind", "look"),
                      outputs=el(ui, *SHOWN, *SETTING_NAMES), api_name="gallery_open", show_progress="minimal", **LIGHT)
    ui.link_run.submit(by_name(ui, open_link), inputs=el(ui, "link_run", "tradeoff_kind", "look"),
                       outputs=el(ui, *SHOWN, *SETTING_NAMES), api_name="link_open", show_progress="minimal", **LIGHT)
    ui.share_btn.click(by_name(ui, on_share_click), inputs=ui.comparison, outputs=el(ui, "share_link", "status"),
                       **PRIVATE)
    ui.page_btn.click(by_name(ui, on_page_export), inputs=el(ui, "comparison", "origin"),
                      outputs=el(ui, "page_file", "status"), **PRIVATE)
    demo.load(by_name(ui, on_model_timer), outputs=el(ui, "model_status", "model_timer"), show_progress="hidden",
              **PRIVATE)


# -- serving ----------------------------------------------------------------------------------------

def main() -> None:
    """`python app.py`: torch's threads, the decode check, the page, its queue; serve first, then load, so the page
    (and its recorded run) is up in seconds while the models load."""
    threads = configure_threads()
    try:
        check_forced_paths()  # a mistyped or impossible SBON_DECODE/SBON_WEIGHTS stops the app at once, in one line
    except SBoNError as e:
        sys.exit(str(e))
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    log.info("models will run on %s, starting on %d CPU thread%s (each run takes the threads free at its start)",
             MODELS.device(), threads, "" if threads == 1 else "s")
    demo = create_app(MODELS, threads)
    demo.queue(default_concurrency_limit=LIGHT_EVENTS, max_size=QUEUE_SIZE)
    gradio_adapter.quiet_queue(demo)  # a server with nothing to do wakes up fifty times a second, not a thousand
    # ZeroGPU: the default models go to the (patched) GPU now, in this process, before launch; elsewhere they
    # load once the page is up.
    load_before_launch(lambda: MODELS.get(DEFAULTS.generator, DEFAULTS.reward))
    generation = start_generation()  # the torch thread, at the priority the app was started with
    # What a visitor only reads is served as files beside the page (components/static_pages.py), never through the queue.
    # An open page that waits for nothing stays idle, and a plot whose redraw fails is drawn afresh
    # (gradio_adapter.PageScripts).
    demo.launch(theme=gr.themes.Soft(), css=CSS, prevent_thread_lock=True,
                app_kwargs={"routes": [Mount(PAGES_PREFIX, app=PAGES.routes())],
                            "middleware": [Middleware(gradio_adapter.PageScripts)]})
    serve_below_generation(generation)  # the server's threads, and every one started from here on, below the torch thread
    start_loading_models()
    threading.Thread(target=warm_gallery, daemon=True, name="gallery-views").start()
    threading.Thread(target=PAGES.warm, daemon=True, name="static-pages").start()
    demo.block_thread()


if __name__ == "__main__":
    main()
