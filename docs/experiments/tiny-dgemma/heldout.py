"""Held-out accuracy of a tiny-dgemma checkpoint per task, gen length and denoising steps per canvas.

usage: python docs/experiments/tiny-dgemma/heldout.py FOLDER N [STEPS_PER_CANVAS,...] [GEN,...]
(FOLDER: a trained model, or the resumable state .unmask/train/tiny-dgemma/last; one JSON line per cell)
"""
import json, sys, time, torch
torch.set_num_threads(1)
from evals.quality import evaluate_items
from evals.tasks import TASKS, make_split
from models import load
from sampler import SamplerConfig
folder, n = sys.argv[1], int(sys.argv[2])
steps_list = [int(s) for s in sys.argv[3].split(",")] if len(sys.argv) > 3 else [16]
gens = [int(g) for g in sys.argv[4].split(",")] if len(sys.argv) > 4 else [32, 64, 128]
h = load(folder)
L = h.canvas_length
rows = []
for task in ("arith", "arith-ko"):
    items = make_split(TASKS[task], "test", n)
    for gen in gens:
        for per_canvas in steps_list:
            cfg = SamplerConfig(steps=per_canvas * (gen // L), gen_length=gen, block_length=L, seed=0)
            t = time.time()
            r = evaluate_items(h, items, cfg, batch_size=25)
            row = {"task": task, "gen": gen, "steps_per_canvas": per_canvas, "n": r["n"], **r["accuracy"],
                   "nfe": r["nfe"], "s": round(time.time() - t, 1)}
            rows.append(row); print(json.dumps(row), flush=True)
