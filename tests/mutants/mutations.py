"""Bugs planted on purpose, each with the tests that must catch it (``python -m tests.mutants.run``).

Every entry replaces one exact piece of sampan's source (it must occur once) in a throwaway copy
of the repository; the named tests must then fail. A mutation the suite lets through is a test
gap: the harness exits non-zero and names it. The mutations never touch the real tree.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One planted bug.

    Fields:
        name: short id (``--only`` takes it).
        why: the regression it stands for, and where it was found (issue and item).
        path: the file to edit, relative to the repository root.
        old: text that occurs exactly once in ``path``.
        new: what replaces it.
        tests: pytest node ids / ``-k`` selections (as argv) that must fail with the bug in.
    """

    name: str
    why: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


MUTATIONS: tuple[Mutation, ...] = (
    Mutation(
        "qk-norm-gradient-not-summed",
        "issue 24: Qwen3's per-head q / k norm weights stay plain tensors under tensor parallel, so each "
        "mp rank steps with its own partial gradient (found: mp2 drifted 1.4e-4 by step 5)",
        "sampan/models/llama/parallelize.py",
        '    "*layers.*.self_attn.q_norm": "head_norm",\n    "*layers.*.self_attn.k_norm": "head_norm",\n',
        "",
        ("tests/test_fleet.py", "-k", "llama and mp2 and not pp2 and not dp2 and not sequence"),
    ),
    Mutation(
        "llama3-rope-scaling-ignored",
        "issue 24: Llama 3.1's long-context RoPE scaling read but not applied",
        "sampan/nn/rope.py",
        "        return torch.where(medium, blended, scaled)",
        "        return inv_freq",
        ("tests/test_llama.py", "-k", "rope"),
    ),
    Mutation(
        "gpt2-conv1d-not-transposed",
        "issue 24: GPT-2's Conv1D weights loaded without the transpose nn.Linear needs",
        "sampan/models/gpt/hf.py",
        '    if module.endswith(CONV1D) and param == "weight":\n        tensor = tensor.t()\n    fused',
        '    fused',
        ("tests/test_hf_checkpoints.py", "-k", "gpt2"),
    ),
    Mutation(
        "kv-heads-not-checked-against-mp",
        "issue 24: an mp degree that does not divide num_key_value_heads is not refused up front",
        "sampan/distributed/strategy.py",
        "        if num_kv_heads is not None and num_kv_heads != num_heads and num_kv_heads % mp:",
        "        if False:",
        ("tests/test_llama.py", "-k", "kv_heads_that_mp_cannot_split"),
    ),
    Mutation(
        "fleet-rng-not-restored",
        "issue 25 item 1: an elastic restart that does not restore each rank's RNG stream (the fleet resume "
        "test ran with dropout 0 and passed without the restore)",
        "sampan/trainer/fleet_backend.py",
        "            restore_rng_state(rngs[self.rank])\n",
        "            pass\n",
        ("tests/test_trainer_fleet.py", "-k", "killed_rank"),
    ),
    Mutation(
        "single-process-rng-not-restored",
        "issue 25 item 1: a single-process resume that does not restore the RNG",
        "sampan/trainer/backend.py",
        '        restore_rng_state(saved["rng"])\n        return saved',
        "        pass\n        return saved",
        ("tests/test_trainer_resume.py", "-k", "sigkill"),
    ),
    Mutation(
        "fleet-gradient-doubled",
        "issue 25 item 5: gradients twice as large as they should be (AdamW hides this; SGD shows it)",
        "sampan/distributed/model.py",
        "(part * self.hcg.grad_world_size).backward()",
        "(part * self.hcg.grad_world_size * 2).backward()",
        ("tests/test_fleet.py", "-k", "sgd and (dp2 or mp2) and not xmp2"),
    ),
    Mutation(
        "bert-layer-norm-eps-dropped",
        "issue 25 item 5: the BERT config mapping drops layer_norm_eps (the tests used only its default)",
        "sampan/models/ernie/hf.py",
        '    "layer_norm_eps": "layer_norm_eps",\n',
        "",
        ("tests/test_hf_bert.py",),
    ),
    Mutation(
        "llama-rms-norm-eps-dropped",
        "issue 25 item 5: the Llama / Qwen config mapping drops rms_norm_eps",
        "sampan/models/llama/hf.py",
        '    "rms_norm_eps": "rms_norm_eps",\n',
        "",
        ("tests/test_hf_checkpoints.py", "-k", "round_trip and (llama or qwen)"),
    ),
    Mutation(
        "gpt2-layer-norm-epsilon-dropped",
        "issue 25 item 5: the GPT-2 config mapping drops layer_norm_epsilon",
        "sampan/models/gpt/hf.py",
        '    "layer_norm_epsilon": "layer_norm_eps",\n',
        "",
        ("tests/test_hf_checkpoints.py", "-k", "gpt"),
    ),
    Mutation(
        "to-static-branches-swapped",
        "issue 25 item 2: to_static swaps an if's true and false branches (every seed's input summed negative, "
        "so a dozen programs never took one arm)",
        "sampan/jit/passes/ifelse.py",
        'f"_jst.IfElse(TEST, {true_fn}, {false_fn}, ARGS, NAMES, BOTH, WHERE)"',
        'f"_jst.IfElse(TEST, {false_fn}, {true_fn}, ARGS, NAMES, BOTH, WHERE)"',
        ("tests/test_jit_corpus.py", "-k", "p_if or p_elif or p_nested_if or p_early_return"),
    ),
    Mutation(
        "tensor-array-count-not-advanced",
        "issue 29: a list appended under tensor control flow (a tensor array) does not count the element "
        "it appends, so torch.stack of it drops rows",
        "sampan/jit/tensor_array.py",
        "        return TensorArray(buffer, grown.count + 1, grown.limit + 1)",
        "        return TensorArray(buffer, grown.count, grown.limit + 1)",
        ("tests/test_jit_corpus.py", "-k", "under_to_static and (p_list or p_layer_tensor_array)"),
    ),
    Mutation(
        "loop-return-value-not-carried",
        "issue 29: a return inside a tensor loop whose value is not given a starting value by the probe "
        "(the loop then keeps it local and the return is lost)",
        "sampan/jit/runtime/while_loop.py",
        "        for i in returns:\n            if carriable(outs[i]):\n                values[i] = zeros_like(outs[i])",
        "        for i in returns[:0]:\n            if carriable(outs[i]):\n                values[i] = zeros_like(outs[i])",
        ("tests/test_jit_corpus.py", "-k", "under_to_static and p_return"),
    ),
    Mutation(
        "inputs-limit-off-by-one",
        "serving limits tested only above the limit: max_inputs_per_request refuses a request with exactly "
        "the limit (>= for >); the fuzz took any 4xx and never sent the limit itself",
        "sampan/serving/tasks.py",
        "    if len(inputs) > max_inputs:",
        "    if len(inputs) >= max_inputs:",
        ("tests/test_serving_fuzz.py", "-k", "admits_its_value"),
    ),
    Mutation(
        "text-chars-limit-off-by-one",
        "serving limits tested only above the limit: max_text_chars refuses a text of exactly the limit",
        "sampan/serving/tasks.py",
        "        if len(text) > max_chars:",
        "        if len(text) >= max_chars:",
        ("tests/test_serving_fuzz.py", "-k", "admits_its_value"),
    ),
    Mutation(
        "body-length-limit-off-by-one",
        "serving limits tested only above the limit: max_body_bytes (by Content-Length) refuses a body of "
        "exactly the limit",
        "sampan/serving/middleware.py",
        "if int(value) > limit:",
        "if int(value) >= limit:",
        ("tests/test_serving_fuzz.py", "-k", "admits_its_value"),
    ),
    Mutation(
        "body-stream-limit-off-by-one",
        "serving limits tested only above the limit: max_body_bytes, counted while a chunked body streams "
        "in, refuses a body of exactly the limit",
        "sampan/serving/middleware.py",
        "            if size > limit:",
        "            if size >= limit:",
        ("tests/test_serving_fuzz.py", "-k", "admits_its_value and chunked"),
    ),
    Mutation(
        "model-rows-limit-off-by-one",
        "serving limits tested only above the limit: max_inputs_per_request refuses a model request with "
        "exactly the limit of rows",
        "sampan/serving/models.py",
        "        if rows > max_rows:",
        "        if rows >= max_rows:",
        ("tests/test_serving_fuzz.py", "-k", "admits_its_value"),
    ),
    Mutation(
        "pipeline-gradients-scaled-by-microbatches",
        "issue 25 item 5: a pipeline schedule that also divides the gradients by the micro-batch count "
        "(the loss is already a mean over the step); AdamW hides it, plain SGD does not",
        "sampan/distributed/pipeline.py",
        "loss_fn=self._loss, scale_grads=False)",
        "loss_fn=self._loss, scale_grads=True)",
        ("tests/test_fleet.py", "-k", "gradient_scale_matches_one_process_under_sgd and pp2"),
    ),
    Mutation(
        "store-imports-the-recipes",
        "issue 26 item 1: the low-level model store importing the hub's recipes again (the import "
        "cycle of eight packages came from such a line)",
        "sampan/store/models.py",
        "from sampan.utils.paths import user_models_dir\n",
        "from sampan.utils.paths import user_models_dir\n\n\ndef _recipes():\n    from sampan.hub.recipes import RECIPES\n\n"
        "    return RECIPES\n",
        ("tests/test_layers.py", "-k", "every_import_goes_down"),
    ),
    Mutation(
        "readme-figure-not-its-results",
        "issue 25 item 6: a results file rerun (or a README figure edited by hand) without the README "
        "re-rendered from it",
        "benchmarks/results/model_step.json",
        '"ratio_sampan_over_baseline": 0.9759143484052756,',
        '"ratio_sampan_over_baseline": 0.9159143484052756,',
        ("tests/test_readme_figures.py", "-k", "are_the_results_files"),
    ),
    Mutation(
        "mfu-clamped-at-one",
        "issue 26 item 5: MFU clamped at 100% when training outruns the peak, hiding a wrong FLOP count "
        "or peak",
        "sampan/trainer/trainer.py",
        '            metrics["mfu"] = achieved / self._peak_flops',
        '            metrics["mfu"] = min(1.0, achieved / self._peak_flops)',
        ("tests/test_mfu.py", "-k", "not_clamped"),
    ),
    Mutation(
        "ner-decoded-by-argmax",
        "issue 25 item 3: quality floors that could not fail (0 < f1 <= 1): the shipped NER model decoded "
        "token by token instead of by BIO-constrained Viterbi with its tag prior loses ~0.03 F1",
        "sampan/finetune/tags.py",
        "    return viterbi_bio(logits, labels, [end > start for start, end in offsets], transitions)",
        "    return [int(i) for i in logits.argmax(-1)]",
        ("tests/test_hub.py", "-k", "evaluate_rescores"),
    ),
    Mutation(
        "zero3-pipeline-reduces-once",
        "issue 28: a ZeRO-3 pipeline left to torch's stage keeps every block gathered and its gradients "
        "unsharded until the last micro-batch (the losses stay equal, the memory does not)",
        "sampan/distributed/fleet.py",
        "zero3 = hcg.grad_world_size > 1 and strategy.sharding_configs.stage == 3",
        "zero3 = False",
        ("tests/test_fleet.py", "-k", "zero3_carried_through_pipelines"),
    ),
    Mutation(
        "context-parallel-mask-dropped",
        "issue 28: context-parallel attention without the causal mask of the true positions (each query "
        "would see the future tokens other ranks hold)",
        "sampan/distributed/context_parallel.py",
        "second = attend(query.narrow(dim, c, c), keys, values, attn_mask=self.late_mask.to(device))",
        "second = attend(query.narrow(dim, c, c), keys, values)",
        ("tests/test_fleet.py", "-k", "cp2 and gpt and not xpp2 and not sharding"),
    ),
    Mutation(
        "o2-gradients-reduced-in-bf16",
        "issue 28: O2 reducing gradients in bf16 even with master gradients on (half the traffic, lossy sums)",
        "sampan/distributed/precision.py",
        "reduce = torch.float32 if amp.use_master_grad else torch.bfloat16",
        "reduce = torch.bfloat16",
        ("tests/test_fleet.py", "-k", "amp_levels"),
    ),
    Mutation(
        "offloaded-input-detached",
        "issue 28: activation offload keeping a detached host copy of a block's input (the values are "
        "right, the gradient stops at every block)",
        "sampan/nn/recompute.py",
        "    return x.to(host, copy=True)",
        "    return x.detach().to(host, copy=True)",
        ("tests/test_offload.py", "tests/test_fleet.py", "-k", "offload"),
    ),
    Mutation(
        "offload-planned-as-kept",
        "issue 28: the planner pricing offload's block inputs as still on the device",
        "sampan/planner/memory.py",
        "    if not layout.offload:\n        return 0.0",
        "    if True:\n        return 0.0",
        ("tests/test_offload.py", "tests/test_simulate.py", "-k", "offload or committed"),
    ),
    Mutation(
        "expert-grads-not-reduced-over-edp",
        "issue 38: expert-parallel experts left out of FSDP2 (ignored), so their gradients are never "
        "reduced over their expert-data-parallel ranks and each rank steps with its own",
        "sampan/distributed/sharding.py",
        "    for unit in experts:\n        fully_shard(unit, mesh=expert_mesh, reshard_after_forward=reshard,\n"
        "                    shard_placement_fn=functools.partial(expert_shard_placement, ranks=expert_mesh.shape[-1]), "
        "**extra)\n"
        "    for unit in shard_units(model):\n        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, **extra)\n"
        "    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, **extra)",
        "    ignored = {p for unit in experts for p in unit.parameters()}\n"
        "    for unit in shard_units(model):\n"
        "        fully_shard(unit, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored, **extra)\n"
        "    fully_shard(model, mesh=mesh, reshard_after_forward=reshard, ignored_params=ignored, **extra)",
        ("tests/test_expert_parallel.py", "-k", "ep2_over_4"),
    ),
    Mutation(
        "ep-results-to-wrong-rank",
        "issue 38: expert outputs sent back in local-expert order instead of the order the tokens came "
        "in, so after the combine all-to-all results land on the wrong rank and token",
        "sampan/distributed/expert_parallel.py",
        "        back = output.index_select(0, restored)",
        "        back = output",
        ("tests/test_expert_parallel.py", "-k", "ep2_over_4"),
    ),
    Mutation(
        "aux-free-bias-wrong-sign",
        "issue 38: the aux-loss-free correction bias raised for overloaded experts (DeepSeek-V3 lowers it)",
        "sampan/nn/moe_balance.py",
        "    return rate * torch.sign(load.mean() - load)",
        "    return rate * torch.sign(load - load.mean())",
        ("tests/test_moe_layer.py", "-k", "bias"),
    ),
)
