"""A Tinker SDK user's whole walk against a running art-server, on whatever `tinker` this
interpreter has: `python sdk_walkthrough.py <url> <api key> <base model>`.

It imports nothing of ours (so it runs in an environment that holds only the SDK) and prints one
line, `WALKTHROUGH {json}`: the SDK's version and what each step answered. The suite runs it on
the locked SDK and on the next one (`test_tinker_versions`).
"""

from __future__ import annotations

import json
import sys

import tinker
from tinker import types


def ready(client):
    """A created client: 0.38 answers a future of it, earlier SDKs the client itself."""
    return client.result() if hasattr(client, "result") else client


def main(url: str, api_key: str, base_model: str) -> dict:
    """Train a step, save and sample, then the REST calls; what each answered."""
    service = tinker.ServiceClient(user_metadata={"walk": "through"}, base_url=url, api_key=api_key)
    tokens = list(range(10, 22))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * 11},
    )
    training = ready(service.create_lora_training_client(base_model=base_model, rank=4))
    before = training.forward_backward([datum], "cross_entropy").result().metrics["loss:sum"]
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    after = training.forward([datum], "cross_entropy").result().metrics["loss:sum"]
    state = training.save_state("walk").result().path
    sampler_path = training.save_weights_for_sampler("walk").result().path
    sampler = ready(service.create_sampling_client(model_path=sampler_path))
    sampled = sampler.sample(
        types.ModelInput.from_ints(tokens[:4]), 2, types.SamplingParams(max_tokens=3, seed=1)
    ).result()
    rest = tinker.RestClient(base_url=url, api_key=api_key)
    listed = rest.list_user_checkpoints().result().checkpoints
    info = rest.get_weights_info_by_tinker_path(state).result()
    rest.set_checkpoint_ttl_from_tinker_path(state, 3600).result()
    rest.publish_checkpoint_from_tinker_path(sampler_path).result()
    rest.delete_checkpoint_from_tinker_path(state).result()
    left = rest.list_checkpoints(training.model_id).result().checkpoints
    sessions = rest.list_sessions().result().sessions
    service.close("success")
    return {
        "version": tinker.__version__,
        "loss_before": before,
        "loss_after": after,
        "sampled": [len(sequence.tokens) for sequence in sampled.sequences],
        "listed": sorted(checkpoint.tinker_path for checkpoint in listed),
        "weights_info": [info.base_model, info.lora_rank],
        "left": [[c.tinker_path, c.public] for c in left],
        "sessions": len(sessions),
        "paths": [state, sampler_path],
    }


if __name__ == "__main__":
    print("WALKTHROUGH " + json.dumps(main(*sys.argv[1:4])))
