"""generate: predictions of one trained system on `generate.split`."""
import argparse
import time
from pathlib import Path

from storyrewrite.data.prepare import load_instances
from storyrewrite.generation.generate import generate_predictions
from storyrewrite.io import run_stage
from storyrewrite.models.device import resolve_device
from storyrewrite.params import Params
from storyrewrite.records import StageRecord


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="prepared data dir")
    parser.add_argument("--out", type=Path, required=True, help="predictions .jsonl")
    StageRecord.add_argument(parser)
    args = parser.parse_args()
    record = StageRecord.start(args.record)
    params = Params.load()
    config = params.generate
    instances = load_instances(args.data, params.task, config.split)
    device = resolve_device(params.device)
    started = time.perf_counter()
    generated = generate_predictions(args.model, instances, params.task, config, params.models, args.out, params.seed, device)
    seconds = time.perf_counter() - started
    n, resumed = generated.predictions, len(instances) - generated.predictions
    print(f"{args.out}: {len(instances)} predictions ({n} generated now from {generated.decoded} distinct inputs, "
          f"{resumed} resumed) on {device} ({config.dtype}) in {seconds:.1f} s = {generated.decoded / seconds:.1f} inputs "
          f"decoded/s" + (f"; {generated.cut} cut at generate.max_new_tokens ({config.max_new_tokens})" if generated.cut else ""))
    if record:
        # The rate is of inputs decoded: instances that share an input (a TimeTravel test story's three
        # rewrites) share its prediction, so predictions/s would count each decoding up to three times.
        record.finish(device, config.dtype, generated.decoded, "inputs decoded", generate_s=round(seconds, 2),
                      predictions=n, decoded_per_s=round(generated.decoded / seconds, 3) if seconds > 0 else None,
                      resumed=resumed, cut_at_limit=generated.cut)


if __name__ == "__main__":
    run_stage(main)
