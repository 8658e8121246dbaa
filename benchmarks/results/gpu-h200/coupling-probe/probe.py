"""One-off GPU diagnostic: why bf16 coupling breaks through CUDA graphs, and where a warm step's time goes."""
import sys, time, json, os, argparse
sys.path.insert(0, os.getcwd())
import torch
from benchmarks import gpu_check, common
from benchmarks.gpu_stand_ins import stand_in, smollm2_tokenizer, SMOLLM2_135M, forced_lengths
from sbon import algorithms, config as C, decoders, engine
from sbon.config import RunConfig
from sbon.decoders import graphs, EagerDecoder
from sbon.models import load_reward
from sbon.cuda_graphs import GraphDecoder

dev = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
out = {}
T0 = time.perf_counter()
def log(*a):
    print(f"[{time.perf_counter()-T0:6.1f}s]", *a, flush=True)
sampling = engine.SamplingConfig(0.8, 0.95, 0)
prompt = common.load_prompts(1)[0]["instruction"]
tok = smollm2_tokenizer()
def make(dtype="bfloat16", attn=None):
    g = stand_in(tok, dev, dtype, SMOLLM2_135M)
    if attn: g.model.set_attn_implementation(attn)
    g.lengths = forced_lengths(16, 48, 64, 0)
    return g
orig_chunk = RunConfig.chunk_on
REC = {}
def recording(gen, name):
    dec = decoders.decoder(gen, "compiled") if name != "eager" else None
def run(gen, reward, method, decode, rec=None, n=16, tokens=64, chunk=None):
    cfg = RunConfig.build(sampling, method=method, n=n, alpha=0.5, max_new_tokens=tokens, seed=0, decode=decode,
                          **({"decode_chunk": chunk} if chunk else {}))
    d = decoders.decoder(gen, decode)
    fwd = d.forward
    if rec is not None:
        def f(batch, tokens_):
            fwd(batch, tokens_)
            L = batch.cache.get_seq_length()
            for i, k in enumerate(batch.candidate_ids):
                rec[(k, L)] = batch.logits[i].clone()
        d.forward = f
    try:
        return common.timed_run(algorithms.events(gen, reward, prompt, cfg))
    finally:
        d.forward = fwd
def compare(gen, reward, decode, fresh=False, chunk=None, first="sbon", second="bon"):
    ra, rb = {}, {}
    if fresh: gen._graph_decoder = None
    a = run(gen, reward, first, decode, ra, chunk=chunk)
    if fresh: gen._graph_decoder = None
    b = run(gen, reward, second, decode, rb, chunk=chunk)
    bon = {c.id: c for c in b.candidates}
    surv = [c for c in a.candidates if c.pruned_round is None]; pr = [c for c in a.candidates if c.pruned_round is not None]
    res = {"decisions": [p.tokens for p in getattr(a, "decision_points", [])], "decode": a.decode, "survivors": len(surv), "pruned": len(pr),
           "survivors_differ": sum(c.token_ids != bon[c.id].token_ids for c in surv),
           "pruned_not_prefix": sum(c.token_ids != bon[c.id].token_ids[:len(c.token_ids)] for c in pr)}
    firsts = []
    for c in a.candidates:
        t2 = bon[c.id].token_ids
        div = next((i for i, (x, y) in enumerate(zip(c.token_ids, t2)) if x != y), None)
        keys = sorted(L for (k, L) in ra if k == c.id and (k, L) in rb)
        dl = next((L for L in keys if not torch.equal(ra[(c.id, L)], rb[(c.id, L)])), None)
        md = float((ra[(c.id, dl)].float() - rb[(c.id, dl)].float()).abs().max()) if dl is not None else 0.0
        firsts.append({"cand": c.id, "first_token_diff": div, "first_logits_diff_at_len": dl, "maxdiff": md})
    res["first_logit_diffs"] = sorted((f["first_logits_diff_at_len"] for f in firsts if f["first_logits_diff_at_len"] is not None))[:8]
    res["token_diff_same_logits"] = sum(1 for f in firsts if f["first_token_diff"] is not None and f["first_logits_diff_at_len"] is None)
    res["maxdiff"] = max(f["maxdiff"] for f in firsts)
    return res
def tests():
    gen = make(); reward = load_reward("likelihood", generator=gen)
    graphs(gen)
    run(gen, reward, "bon", "compiled")  # warm
    for name, kw in [("graph sbon-vs-bon", {}), ("graph bon-vs-bon", {"first": "bon"}),
                     ("graph sbon-vs-sbon", {"second": "sbon"}),
                     ("graph fresh decoders", {"fresh": True}), ("graph chunk1", {"chunk": 1}),
                     ("eager sbon-vs-bon", {"decode": "eager"})]:
        kw.setdefault("decode", "compiled")
        try:
            out[name] = compare(gen, reward, **kw)
        except Exception as e:
            out[name] = f"{type(e).__name__}: {e}"[:300]
        log(name, out[name])
    # row independence of one graph: the same 16 inputs permuted
    gen.lengths = {}
    d = graphs(gen)
    pre = gen.prefill(gen.encode_prompt(prompt))
    toks = torch.randint(0, 40000, (3, 16), device=dev)
    perm = torch.randperm(16, device=dev)
    def steps(tk):
        b = d.start(pre, list(range(16)), False, 64)
        outs = []
        for s in range(3):
            d.forward(b, tk[s]); outs.append(b.logits.clone())
        b.keep([])  # free
        return outs
    A = steps(toks); B = steps(toks[:, perm])
    out["graph rows permuted equal"] = [bool(torch.equal(A[s][perm], B[s])) for s in range(3)]
    out["graph rows permuted maxdiff"] = [float((A[s][perm].float() - B[s].float()).abs().max()) for s in range(3)]
    log("perm", out["graph rows permuted equal"], out["graph rows permuted maxdiff"])
    # same with eager decoder, 16 vs first 11 rows
    e = EagerDecoder(gen)
    def esteps(tk, rows):
        b = e.start(pre, list(range(rows)), False, 64); outs = []
        for s in range(3):
            e.forward(b, tk[s, :rows]); outs.append(b.logits.clone())
        return outs
    E16 = esteps(toks, 16); E11 = esteps(toks, 11)
    out["eager 11 vs 16 rows equal"] = [bool(torch.equal(E16[s][:11], E11[s])) for s in range(3)]
    out["graph vs eager maxdiff"] = [float((A[s].float() - E16[s].float()).abs().max()) for s in range(3)]
    log("eager", out["eager 11 vs 16 rows equal"], out["graph vs eager maxdiff"])
    # timing: replay alone, sample alone, a BoN run
    b = d.start(pre, list(range(16)), False, 128)
    slab = d._slab_of(b); rep = d.graph(slab, 16)
    for _ in range(5): rep()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    t = time.perf_counter()
    for _ in range(50): rep()
    torch.cuda.synchronize() if dev.type == "cuda" else None
    out["replay_ms"] = (time.perf_counter() - t) / 50 * 1000
    t = time.perf_counter()
    for _ in range(50): d.forward(b, toks[0]) if False else None
    u = torch.rand(16, dtype=torch.float64, device=dev); lg = A[0]
    for _ in range(5): engine.sample(lg, u, sampling)
    torch.cuda.synchronize() if dev.type == "cuda" else None
    t = time.perf_counter()
    for _ in range(50): engine.sample(lg, u, sampling)
    torch.cuda.synchronize() if dev.type == "cuda" else None
    out["sample_ms"] = (time.perf_counter() - t) / 50 * 1000
    b.keep([])
    gen.lengths = {}
    for chunk in (1, 8):
        r = run(gen, reward, "bon", "compiled", n=16, tokens=128, chunk=chunk)
        out[f"bon16x128 chunk{chunk}"] = {"wall": r.wall_time, "timings": r.timings}
    log("timing", {k: out[k] for k in out if "ms" in k or "bon16" in k})
    # candidate fix: our one-query attention on the GPU's graphs too
    del gen, d, reward
    gen = make(attn="sbon_decode"); reward = load_reward("likelihood", generator=gen); graphs(gen)
    run(gen, reward, "bon", "compiled")
    out["graph sbon_decode attention"] = compare(gen, reward, "compiled"); log("sbon_decode", out["graph sbon_decode attention"])
    gen.lengths = {}
    r = run(gen, reward, "bon", "compiled", n=16, tokens=128); out["bon16x128 sbon_decode"] = {"wall": r.wall_time, "timings": r.timings}
    log("sbon_decode timing", out["bon16x128 sbon_decode"])
from sbon.attention import register; register()
try:
    tests()
finally:
    path = os.path.join(os.environ.get("OUT", "/tmp"), "probe.json")
    json.dump(out, open(path, "w"), indent=1, default=str); log("wrote", path)
