"""Why the slab step's CUDA graph is skipped: one variant per process (argv[1])."""
import sys, time, torch
from torch._dynamo.utils import counters
from benchmarks import gpu_check as g
from sbon.decoders import CompiledDecoder, MIN_ROWS
from sbon.engine import Generator
from sbon.static_cache import SlabLayer

variant = sys.argv[1]
arch_name = sys.argv[2] if len(sys.argv) > 2 else "tiny"
dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
arch = {**g.SMOLLM2_135M, **(g.TINY_ARCH if arch_name == "tiny" else {})}
gen = g.stand_in(g.smollm2_tokenizer(), dev, "bfloat16", arch, cls=Generator)

if "noupdate" in variant:  # the slab's update without the in-graph cumulative_length.add_ (prepare() fills it)
    def update(self, key_states, value_states, *args, **kwargs):
        pos = torch.arange(key_states.shape[-2], device=self.device) + self.cumulative_length
        self.keys.index_copy_(2, pos, key_states)
        self.values.index_copy_(2, pos, value_states)
        return self.keys, self.values
    SlabLayer.update = update


class Probe(CompiledDecoder):
    def forward(self, batch, tokens):
        ctx = torch.no_grad() if "nograd" in variant else torch.inference_mode()
        with ctx:
            cache, live = batch.cache, len(tokens)
            rows = self.rows(live)
            tokens = torch.cat([tokens, tokens[-1:].expand(rows - live)])
            cache.prepare(rows, cache.max_len if self.graphs else None)
            positions = cache.layers[0].cumulative_length.view(1, 1).expand(rows, 1)
            if "clonepos" in variant:
                positions = positions.clone()
            if "markall" in variant:
                for layer in cache.layers:
                    for t in (layer.keys, layer.values, layer.cumulative_length):
                        torch._dynamo.mark_static_address(t, guard=False)
            logits, hidden = self.step(self.gen.model, tokens.view(-1, 1), positions, cache, batch.keep_hidden)
            cache.advance()
            batch.logits = logits[:live]


dec = Probe(gen, graphs=True)
ctx = torch.no_grad() if "nograd" in variant else torch.inference_mode()
with ctx:
    prefix = gen.prefill(list(range(1, 65)))
r = g.time_steps(dec, prefix, 4, 30)
print(f"RESULT {variant} {arch_name}: cudagraph_skips={counters['inductor']['cudagraph_skips']} "
      f"ms/step={r['ms_per_step']:.2f} first={r['first_step_s']:.1f}s", flush=True)
