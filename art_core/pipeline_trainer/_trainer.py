"""Asynchronous pipeline training (ART's `art.pipeline_trainer.PipelineTrainer`).

Rollout workers keep sampling while the trainer trains:

    scenarios --> worker 1..W: rollout_fn(model, scenario, config) --> bounded queue --> trainer
                  (waits while the policy is too far behind)   (a full queue     |  batches of
                                                                 makes workers    |  min..max groups
                                                                 wait)            v
                                                         backend.train -> step N+1 -> workers sample it

Staleness. Each group remembers the step its rollouts were sampled at: `model.step` read just
before `rollout_fn` runs, which is the step `model.get_inference_name()` serves to that rollout
(`<name>@<step>`; served names always carry their step) for as long as it runs: the rollout holds
an adapter lease on it (`backend.adapter_lease`), so one straddling a training step samples one
adapter throughout and retention keeps that step until it ends. The trainer moving from policy `s` to
`s + 1` takes a group sampled at `k` only if `k >= s - max_steps_off_policy`; older groups are
dropped and counted (`state.discarded_stale_groups`, and `discarded/step/stale_groups` in that
step's metrics). Workers also wait before starting a rollout that would already be too old.

Off-policy correction needs nothing from the client: the server recorded the sampler's token
logprobs with every completion, the trainer uses them as `old_logprobs` in the importance ratio
(`backend/art_backend/training/_rows.py`, `_trainer.LoraTrainer.grpo_step`,
`_grpo.policy_loss`), so a group sampled at step k is corrected against step k's policy.

Counted, never lost silently (ART's rules): a group whose rewards are all equal is dropped
(`discarded_zero_variance_groups`; too many in one step stops training as a collapse); a
`rollout_fn` that raises is counted (`state.failed_rollouts`) and the worker goes on; a group
whose every rollout raised stops training with `TooManyExceptionsError`. An error of the trainer
stops the workers and is raised; cancelling `train()` cancels them.

A promotion gate (`promote_if=art.PromotionGate(...)`, ours) judges every step as
`model.train(groups, promote_if=gate)` does: a step whose held-out metric drops is trained and
kept on disk but not promoted, so the plain name and `model.get_inference_name()` (what new
rollouts sample) stay on the promoted step. The gate's numbers (`gate/*`) are in the step's
metrics the trackers see; refusals are counted in `state.refused_promotions`. A step the gate
could not judge (its `evaluate` raised) is recorded, not promoted, logged and counted
(`gate/evaluate_errors`); the pipeline goes on, as it does past a failed `eval_fn`. Staleness
still counts from the latest trained step, and retention never offers the promoted step.

`signal=art.GroupSignal()` (ours) adds a pass-rate memory to the workers: a scenario whose last
group was all-equal is passed over the next 1, 2, 4... times it comes round (counted as
`signal/skipped_scenarios` in the step's metrics). Dynamic sampling needs no option here: each
step already waits for `min_batch_size` groups with mixed rewards.

Evaluation runs between two steps (ART runs it beside training): our `model.log` records at the
server's current step, so `eval_fn(model, step, config)` must run while `step` is current.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Iterable,
    Iterator,
    Mapping,
)
from typing import Any, Generic

from art_core._promotion import PromotionGate
from art_core.backend import Backend
from art_core.errors import PromotionGateError, TooManyExceptionsError
from art_core.gather import gather_trajectory_groups
from art_core.model import TrainableModel
from art_core.pipeline_trainer._retention import (
    CheckpointRetentionStrategy,
    apply_retention,
)
from art_core.pipeline_trainer._settings import PipelineRuntimeConfig, PipelineSettings
from art_core.pipeline_trainer._state import (
    POLICY_VERSION_KEY,
    ConfigT,
    EvalFn,
    PipelineState,
    RolloutExecutor,
    RolloutFn,
    ScenarioT,
    StepCounts,
    async_iterator,
    eval_groups,
    policy_version,
    until_stopped,
    zero_variance,
)
from art_core.trajectories import TrajectoryGroup
from art_core.types import TrainConfig, TrainResult
from art_core.utils._signal import GroupSignal

logger = logging.getLogger("art_core.pipeline")

_END = object()  # the scenarios ran out (or training stops): no more groups will come
_SKIPPED = object()  # the GroupSignal passed over this scenario (its recent groups all-equal)


def _setting(name: str) -> Any:
    """An attribute of the trainer that is one of its settings (ART's attribute names): read from
    `trainer.settings`; assigned as in ART (between runs), it replaces that one setting."""

    def assign(trainer: Any, value: Any) -> None:
        trainer.settings = dataclasses.replace(trainer.settings, **{name: value})

    return property(
        lambda trainer: getattr(trainer.settings, name), assign, doc=f"`settings.{name}`"
    )


class PipelineTrainer(Generic[ScenarioT, ConfigT]):
    """Rollouts, training and evaluation at once: workers sample while the trainer trains.

    `rollout_fn(model, scenario, config)` returns one TrajectoryGroup (pending rollouts in it
    are run), in this process or, given `executor=` (e.g. `art_ray.RayExecutor`), where the
    executor runs it; `eval_fn(model, step, config)` returns trajectories or groups to log as "val" (or
    a mapping split -> them; None if it logged itself). `await trainer.train()` runs until the
    scenarios run out, `max_steps` steps are trained, or `request_stop()`. `promote_if`: an
    `art.PromotionGate` each step is trained through (see the module docstring). The keywords
    (ART's) are checked once into `trainer.settings` (`_settings.PipelineSettings`); ART's
    attribute names (`trainer.max_batch_size`, ...) read from it.
    """

    def __init__(
        self,
        model: TrainableModel,
        backend: Backend,
        rollout_fn: RolloutFn[ScenarioT, ConfigT],
        scenarios: Iterable[ScenarioT] | AsyncIterator[ScenarioT],
        config: ConfigT,
        eval_fn: EvalFn[ConfigT] | None = None,
        *,
        num_rollout_workers: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | None = None,
        queue_maxsize: int | None = None,
        pipeline: PipelineRuntimeConfig | None = None,
        learning_rate: float | None = None,
        loss_fn: str | None = None,
        normalize_advantages: bool = True,
        train_config: TrainConfig | None = None,
        max_steps: int | None = None,
        discard_queue_multiplier: int = 100,
        max_steps_off_policy: int | None = 4,
        eval_every_n_steps: int = 20,
        eval_at_start: bool = True,
        checkpoint_retention_strategy: CheckpointRetentionStrategy | None = None,
        checkpoint_retention_interval: int = 1,
        executor: RolloutExecutor | None = None,
        promote_if: PromotionGate | None = None,
        signal: GroupSignal | None = None,
        **unsupported: Any,
    ) -> None:
        self.settings = PipelineSettings.from_keywords(
            unsupported,
            num_rollout_workers=num_rollout_workers, min_batch_size=min_batch_size,
            max_batch_size=max_batch_size, queue_maxsize=queue_maxsize, pipeline=pipeline,
            learning_rate=learning_rate, loss_fn=loss_fn,
            normalize_advantages=normalize_advantages, train_config=train_config,
            max_steps=max_steps, discard_queue_multiplier=discard_queue_multiplier,
            max_steps_off_policy=max_steps_off_policy, eval_every_n_steps=eval_every_n_steps,
            eval_at_start=eval_at_start,
            checkpoint_retention_strategy=checkpoint_retention_strategy,
            checkpoint_retention_interval=checkpoint_retention_interval,
            promote_if=promote_if, signal=signal,
        )  # fmt: skip
        self.model = model
        self.backend = backend
        self._scenarios = async_iterator(scenarios)
        self.rollout_fn = rollout_fn
        self.executor = executor
        self.config = config
        self.eval_fn = eval_fn
        self._scenario_lock = asyncio.Lock()
        self._start_run(PipelineState())

    # ART's attribute names, read from the one settings object.
    pipeline = _setting("pipeline")
    num_rollout_workers = _setting("num_rollout_workers")
    min_batch_size = _setting("min_batch_size")
    max_batch_size = _setting("max_batch_size")
    queue_maxsize = _setting("queue_maxsize")
    max_steps_off_policy = _setting("max_steps_off_policy")
    train_config = _setting("train_config")
    max_steps = _setting("max_steps")
    discard_queue_multiplier = _setting("discard_queue_multiplier")
    eval_every_n_steps = _setting("eval_every_n_steps")
    eval_at_start = _setting("eval_at_start")
    checkpoint_retention_strategy = _setting("checkpoint_retention_strategy")
    checkpoint_retention_interval = _setting("checkpoint_retention_interval")
    promote_if = _setting("promote_if")
    group_signal = _setting("signal")

    def _start_run(
        self, state: PipelineState, workers: int = 0, main: asyncio.Task[Any] | None = None
    ) -> None:
        """A run's fresh state: its counters, queue, stop and policy events, running workers."""
        self.state = state
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=self.settings.queue_maxsize)
        self._stop = asyncio.Event()
        self._policy_changed = asyncio.Event()
        self._counts = StepCounts()
        self._workers_running = workers
        self._worker_error: BaseException | None = None
        self._main_task = main

    # ------------------------------------------------------------------------------ the run

    async def train(self, *, handle_signals: bool = True) -> None:
        """Run workers and trainer until the scenarios end, `max_steps`, or `request_stop()`.

        `handle_signals`: Ctrl-C / SIGTERM ask for a clean stop (the step in progress finishes).
        """
        start_step = await self.model.get_step()
        # Rollouts sampled up to max_steps_off_policy steps back may still be running: the
        # server keeps that many older steps loaded, or their next call would find no model.
        await self.backend.register(self.model, served_steps=self.settings.served_window + 1)
        self._start_run(
            PipelineState(
                policy_version=start_step, next_training_step=start_step, last_eval_step=start_step
            ),
            workers=self.settings.num_rollout_workers,
            main=asyncio.current_task(),
        )
        workers = [
            asyncio.create_task(self._rollout_worker(index), name=f"rollout_worker_{index}")
            for index in range(self.settings.num_rollout_workers)
        ]
        for worker in workers:
            worker.add_done_callback(self._worker_finished)
        with self._stop_on_signals(handle_signals):
            try:
                if self.eval_fn is not None and self.settings.eval_at_start:
                    await self._run_eval(start_step)
                await self._training_stage(start_step)
            finally:
                self.request_stop()
                for worker in workers:
                    worker.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
        if self._worker_error is not None:
            raise self._worker_error

    def request_stop(self) -> None:
        """Ask for a clean stop: no new rollouts; the trainer ends after its current step."""
        self.state.done = True
        self._stop.set()

    async def _training_stage(self, step: int) -> None:
        stop_at = None if self.settings.max_steps is None else step + self.settings.max_steps
        while stop_at is None or step < stop_at:
            waited = time.monotonic()
            batch, ended = await self._collect_batch(step)
            if self._worker_error is not None:
                raise self._worker_error
            if not batch:
                return
            idle_seconds = time.monotonic() - waited
            counts, self._counts = self._counts, StepCounts()
            metrics = self._step_metrics(step, batch, counts, idle_seconds)
            self.state.next_training_step = step + 1
            result = await self._train_step(batch, metrics)
            if self.model.step != result.step:  # a backend call that did not update the model
                await self.model.get_step()
            step = result.step
            self.state.policy_version = self.state.next_training_step = step
            self.state.accepted_trainable_groups += len(batch)
            self.state.accepted_steps += 1
            self._wake_workers()
            if counts.zero_variance_groups:
                # ART keeps up to 50 of a step's dropped groups for inspection.
                await self.model.log(counts.zero_variance_groups[:50], split="discarded")
            if self._should_eval(step):
                await self._run_eval(step)
            if self.settings.checkpoint_retention_strategy is not None and (
                self.state.accepted_steps % self.settings.checkpoint_retention_interval == 0
            ):
                await self._apply_retention(step)
            if ended or self.state.done:
                return

    async def _train_step(
        self, groups: list[TrajectoryGroup], client_metrics: dict[str, float]
    ) -> TrainResult:
        """The one call that trains; `client_metrics` are added to the step's metrics."""
        try:
            result = await self.backend.train(
                self.model,
                groups,
                self.settings.train_config,
                client_metrics=client_metrics,
                promote_if=self.settings.promote_if,
            )
        except PromotionGateError as error:
            if error.result is None:  # the baseline could not be measured: nothing trained
                raise
            # The step is trained and recorded but not promoted: counted, and training goes on.
            logger.warning("%s Training goes on (counted in gate/evaluate_errors).", error)
            result = error.result
        if result.metrics.get("gate/refused") == 1.0:
            self.state.refused_promotions += 1
        return result

    async def _apply_retention(self, step: int) -> None:
        """Offer the checkpoints no rollout may still sample to the strategy; delete the rest."""
        assert self.settings.checkpoint_retention_strategy is not None
        self.state.deleted_checkpoints += await apply_retention(
            self.backend,
            self.model,
            self.settings.checkpoint_retention_strategy,
            step,
            oldest_in_use=step - self.settings.served_window,
            eval_steps=self.state.completed_eval_steps,
            # The plain name serves it (a gate refused the steps after it): never deleted.
            protected={self.model.promoted_step},
        )

    def _step_metrics(
        self, step: int, batch: list[TrajectoryGroup], counts: StepCounts, idle: float
    ) -> dict[str, float]:
        """The pipeline's counts for one step, under ART's metric names where ART has one."""
        ages = [step - policy_version(group, step) for group in batch]
        state = self.state
        return {
            "discarded/step/stale_groups": float(counts.stale),
            "discarded/step/zero_variance_groups": float(counts.zero_variance),
            "discarded/step/failed_rollouts": float(counts.failed_rollouts),
            "discarded/cum/stale_groups": float(state.discarded_stale_groups),
            "discarded/cum/zero_variance_groups": float(state.discarded_zero_variance_groups),
            "discarded/cum/failed_rollouts": float(state.failed_rollouts),
            "offpolicy/policy_age_steps_mean": sum(ages) / len(ages),
            "offpolicy/policy_age_steps_max": float(max(ages)),
            "queue/groups_depth": float(self._queue.qsize()),
            "queue/groups_depth_max": float(self.settings.queue_maxsize),
            "time/step_trainer_idle_s": idle,
            **(self.settings.signal.take_step_metrics() if self.settings.signal else {}),
        }

    async def _collect_batch(self, step: int) -> tuple[list[TrajectoryGroup], bool]:
        """min_batch_size groups (waiting), then up to max_batch_size that are ready now.

        Returns the batch and whether no more groups will come (scenarios ended, or stopped).
        """
        batch: list[TrajectoryGroup] = []
        while len(batch) < self.settings.max_batch_size:
            if len(batch) < self.settings.min_batch_size:
                if self._queue.empty() and self._workers_running == 0:
                    return batch, True
                got, item = await self._until_stopped(self._queue.get())
                if not got:
                    return batch, True
            else:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    break
            if item is _END:
                return batch, True
            group: TrajectoryGroup = item
            if not group.trajectories and group.exceptions:
                first = group.exceptions[0]
                raise TooManyExceptionsError(
                    f"All {len(group.exceptions)} rollouts of a group raised "
                    f"({first.type}: {first.message}): the rollout function fails every time, "
                    "training stopped.",
                    first_traceback=first.traceback,
                )
            if self._is_stale(group, step):
                self.state.discarded_stale_groups += 1
                self._counts.stale += 1
                continue
            if zero_variance(group):
                self.state.discarded_zero_variance_groups += 1
                self._counts.zero_variance += 1
                self._counts.zero_variance_groups.append(group)
                if (
                    self._counts.zero_variance
                    >= self.settings.discard_queue_multiplier * self.settings.min_batch_size
                ):
                    self._collapse()
                    return [], True
                continue
            batch.append(group)
        return batch, False

    def _is_stale(self, group: TrajectoryGroup, step: int) -> bool:
        if self.settings.max_steps_off_policy is None:
            return False
        return policy_version(group, step) < step - self.settings.max_steps_off_policy

    def _collapse(self) -> None:
        self.state.collapse_detected = True
        logger.error(
            "Model collapse suspected: %d groups in a row had zero reward variance; training "
            "stopped. Lower the learning rate, check that the reward varies and the scenarios "
            "are diverse, or raise discard_queue_multiplier (now %d x min_batch_size %d).",
            self._counts.zero_variance,
            self.settings.discard_queue_multiplier,
            self.settings.min_batch_size,
        )
        self.request_stop()

    def _should_eval(self, step: int) -> bool:
        if self.eval_fn is None or self.settings.eval_every_n_steps <= 0:
            return False
        return step - self.state.last_eval_step >= self.settings.eval_every_n_steps

    async def _run_eval(self, step: int) -> None:
        """eval_fn at `step`, its results logged; a failing eval is logged and counted (ART)."""
        assert self.eval_fn is not None
        self.state.last_eval_step = step
        try:
            result = await self.eval_fn(self.model, step, self.config)
            splits = result if isinstance(result, Mapping) else {"val": result}
            for split, items in splits.items():
                groups = eval_groups(items)
                if groups:
                    await self.model.log(groups, split=split)
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - an eval failure does not stop training (ART)
            self.state.failed_evals += 1
            logger.warning("eval at step %d failed: %s: %s", step, type(error).__name__, error)
            return
        self.state.completed_eval_steps.add(step)

    # --------------------------------------------------------------------------- the workers

    async def _rollout_worker(self, index: int) -> None:
        try:
            while not self.state.done:
                scenario = await self._next_scenario()
                if scenario is _SKIPPED:  # its recent groups were all-equal (signal/...)
                    continue
                if scenario is _END or not await self._wait_for_policy():
                    return
                version = self.state.policy_version
                try:
                    group = await self._rollout(scenario)
                except asyncio.CancelledError:
                    raise
                except Exception as error:  # noqa: BLE001 - a failed rollout is counted (ART)
                    self.state.failed_rollouts += 1
                    self._counts.failed_rollouts += 1
                    logger.warning(
                        "rollout worker %d: rollout failed (%s: %s); counted in "
                        "discarded/step/failed_rollouts",
                        index,
                        type(error).__name__,
                        error,
                    )
                    continue
                group.metadata[POLICY_VERSION_KEY] = version
                if self.settings.signal is not None:
                    self.settings.signal.record(scenario, group)
                if not (await self._until_stopped(self._queue.put(group)))[0]:
                    return
                self.state.max_queue_depth = max(self.state.max_queue_depth, self._queue.qsize())
        finally:
            self._workers_running -= 1
            if self._workers_running == 0:
                # The last worker out wakes a trainer waiting for groups; a full queue needs no
                # wake-up (the trainer sees no worker left once it has drained it).
                with contextlib.suppress(asyncio.QueueFull):
                    self._queue.put_nowait(_END)

    async def _rollout(self, scenario: Any) -> TrajectoryGroup:
        """One group from `rollout_fn`, its pending rollouts gathered; in this process, under an
        adapter lease on the step it begins on, so that a rollout straddling a training step
        samples one adapter throughout (`get_inference_name()` stays `<name>@<that step>`)."""
        if self.executor is not None:  # another process: the pin (a contextvar) cannot follow
            group = await self.executor.run(self.rollout_fn, self.model, scenario, self.config)
            return await _gathered(group)
        lease = getattr(self.model.backend, "adapter_lease", None)
        if lease is None:  # a backend without leases (ART's protocol does not require them)
            return await _gathered(await self.rollout_fn(self.model, scenario, self.config))
        async with lease(self.model, self.model.promoted_step):
            return await _gathered(await self.rollout_fn(self.model, scenario, self.config))

    def _worker_finished(self, task: asyncio.Task[None]) -> None:
        """A worker that crashed (not a rollout failing: a bug) stops the pipeline."""
        if task.cancelled() or task.exception() is None:
            return
        if self._worker_error is None:
            self._worker_error = task.exception()
        self.request_stop()

    async def _next_scenario(self) -> Any:
        async with self._scenario_lock:
            try:
                got, scenario = await self._until_stopped(anext(self._scenarios))
            except StopAsyncIteration:
                return _END
            if not got:
                return _END
            self.state.scenario_offset += 1
            self.state.total_scenarios_consumed += 1
            if self.settings.signal is not None and self.settings.signal.skip(scenario):
                return _SKIPPED
            return scenario

    async def _wait_for_policy(self) -> bool:
        """Wait while a rollout started now would be too old to train; False when stopping."""
        behind = self.settings.max_steps_off_policy
        if behind is None:
            return not self.state.done
        while self.state.policy_version < self.state.next_training_step - behind:
            if not (await self._until_stopped(self._policy_changed.wait()))[0]:
                return False
        return not self.state.done

    def _wake_workers(self) -> None:
        changed, self._policy_changed = self._policy_changed, asyncio.Event()
        changed.set()

    async def _until_stopped(self, awaitable: Awaitable[Any]) -> tuple[bool, Any]:
        """(True, result) when `awaitable` finishes first; (False, None) once a stop is asked."""
        return await until_stopped(self._stop, awaitable)

    @contextlib.contextmanager
    def _stop_on_signals(self, enabled: bool) -> Iterator[None]:
        """SIGINT/SIGTERM call request_stop() while training (main thread only), then restore."""
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        installed: dict[signal.Signals, Any] = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._stop_requested_by_signal, sig)
            except (NotImplementedError, RuntimeError, ValueError):
                continue
            installed[sig] = previous
        try:
            yield
        finally:
            for sig, previous in installed.items():
                loop.remove_signal_handler(sig)
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(sig, previous)

    def _stop_requested_by_signal(self, sig: signal.Signals) -> None:
        if self.state.done and self._main_task is not None:
            self._main_task.cancel()  # asked twice: stop now (workers are cancelled too)
            return
        logger.warning(
            "%s: finishing the current step, then stopping (again to stop at once)", sig.name
        )
        self.request_stop()


async def _gathered(group: Any) -> TrajectoryGroup:
    """`rollout_fn`'s group with its pending rollouts run (a TypeError for anything else)."""
    if not isinstance(group, TrajectoryGroup):
        raise TypeError(
            f"rollout_fn must return an art.TrajectoryGroup, got {type(group).__name__}"
        )
    if group._pending:
        await gather_trajectory_groups([group], pbar_desc=None, max_exceptions=len(group._pending))
    return group
