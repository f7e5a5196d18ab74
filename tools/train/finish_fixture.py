#!/usr/bin/env python3
"""Completes a device run's fixture_heldout512.json for tests/trained/: adds HF's greedy demo
(the first main-model prompt, no BOS), the other demo prompts' token ids (tokenizer check) and
HF's mean loss over the whole held-out sample, all taken from the same pack (demo.json,
metrics.json) so the test compares the engine with HF's own outputs, never with ours.

Usage: tools/train/finish_fixture.py PACK_DIR OUT.json
"""
import json
import os
import sys


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip())
    pack, out = sys.argv[1], sys.argv[2]
    with open(os.path.join(pack, "fixture_heldout512.json")) as f:
        fx = json.load(f)
    with open(os.path.join(pack, "demo.json")) as f:
        demos = json.load(f)
    with open(os.path.join(pack, "metrics.json")) as f:
        metrics = json.load(f)
    main_demos = [d for d in demos if d["model"] == "main"]
    first = next((d for d in main_demos if not d["bos"]), None)
    if first is None:
        sys.exit("demo.json has no main-model demo without BOS")
    fx["hf_heldout_sample_loss"] = metrics["main_heldout_loss"]
    fx["demo"] = dict(prompt=first["prompt"], prompt_ids=first["prompt_ids"], greedy_ids=first["ids"],
                      text=first["text"], note="HF float32 greedy continuation (no BOS), evaluate.py")
    fx["other_prompts"] = [dict(prompt=d["prompt"], bos=d["bos"], prompt_ids=d["prompt_ids"]) for d in main_demos]
    with open(out, "w") as f:
        json.dump(fx, f)


if __name__ == "__main__":
    main()
