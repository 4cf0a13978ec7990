"""Running the operator's `Controller` and `Poller` for one `submit` command on a
`LocalStore`: submit, follow, cancel, within one deadline and one Ctrl-C."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from slurmjob_operator.api.resource import ObjectRef
from slurmjob_operator.api.status import Phase, SlurmJobStatus, get_condition
from slurmjob_operator.config import Settings
from slurmjob_operator.controller import Controller, RetryLater, Tracked
from slurmjob_operator.controller.poller import Poller
from slurmjob_operator.core.following import is_lost
from slurmjob_operator.core.reconcile import Step, next_step
from slurmjob_operator.local.store import (
    LocalInputError,
    LocalStore,
    default_state_dir,
    new_object,
)
from slurmjob_operator.metrics import Metrics
from slurmjob_operator.slurm.connect import open_transport
from slurmjob_operator.slurm.errors import SlurmError
from slurmjob_operator.storage.executors import close_pools, open_pools

log = logging.getLogger(__name__)

#: How often a `--cancel` or an interrupt retries a deletion the job is still ending for.
_FINALIZE_TRIES = 3


@dataclass
class LocalResult:
    """How a `submit` command ended; the CLI turns it into an exit code."""

    body: dict[str, Any] | None
    timed_out: bool = False
    interrupted: bool = False
    removed: bool = False

    @property
    def status(self) -> dict[str, Any]:
        status = (self.body or {}).get("status") or {}
        return dict(status) if isinstance(status, dict) else {}

    @property
    def phase(self) -> Phase | None:
        return SlurmJobStatus.parse(self.status).phase

    @property
    def invalid_spec(self) -> bool:
        ready = get_condition(SlurmJobStatus.parse(self.status).conditions, "Ready")
        return ready is not None and ready.reason == "InvalidSpec"


@dataclass(frozen=True)
class LocalOptions:
    state_dir: Path
    secrets_file: Path | None = None
    wait: bool = False
    timeout: float = 3600.0
    cancel_on_interrupt: bool = False


class _Interrupt:
    """Ctrl-C as an event: the first one sets it; a second one interrupts the old way."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self._installed = False

    def install(self) -> None:
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGINT, self._fire)
        except (NotImplementedError, RuntimeError, ValueError):
            return  # not the main thread, or no signals here: Ctrl-C raises as usual
        self._installed = True

    def _fire(self) -> None:
        self.event.set()
        self.uninstall()

    def uninstall(self) -> None:
        if self._installed:
            self._installed = False
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_signal_handler(signal.SIGINT)

    @property
    def fired(self) -> bool:
        return self.event.is_set()

    async def sleep(self, seconds: float) -> bool:
        """Sleep; True when interrupted meanwhile."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout=max(0.0, seconds))
        return self.event.is_set()


def _job_text(body: Mapping[str, Any] | None) -> str:
    attempt = SlurmJobStatus.parse((body or {}).get("status")).current_attempt
    if attempt is None:
        return "the job"
    if attempt.job_id is None:
        return f"Slurm job {attempt.job_name}"
    return f"Slurm job {attempt.job_id}"


def _never_submitted(body: Mapping[str, Any] | None) -> bool:
    return SlurmJobStatus.parse((body or {}).get("status")).current_attempt is None


class LocalRunner:
    """One controller over a `LocalStore` for one command, bounded by one deadline."""

    def __init__(
        self,
        settings: Settings,
        options: LocalOptions,
        err: TextIO,
        argv0: str = "slurmjob-operator",
    ) -> None:
        self.settings = settings
        self.options = options
        self.err = err
        self.argv0 = argv0
        self.store = LocalStore(options.state_dir, secrets_file=options.secrets_file, events=err)
        self.interrupt = _Interrupt()
        self._controller: Controller | None = None
        self._deadline = 0.0

    # -- plumbing -----------------------------------------------------------------------

    @property
    def controller(self) -> Controller:
        assert self._controller is not None, "use the runner inside `async with`"
        return self._controller

    async def __aenter__(self) -> LocalRunner:
        # No removal sweep here: the command's finalizer removes a checkpoint in full.
        open_pools()
        transport = open_transport(self.settings)
        try:
            self._controller = Controller(self.settings, self.store, transport, Metrics())
        except BaseException:
            await transport.close()
            close_pools()
            raise
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.options.timeout
        self.interrupt.install()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.interrupt.uninstall()
        if self._controller is not None:
            await self._controller.transport.close()
        close_pools()

    def _remaining(self) -> float:
        return self._deadline - asyncio.get_running_loop().time()

    def say(self, text: str) -> None:
        self.err.write(text + "\n")
        self.err.flush()

    def _hint(self, ref: ObjectRef) -> str:
        where = f" -n {ref.namespace}"
        if self.options.state_dir != default_state_dir():
            where += f" --state-dir {self.options.state_dir}"
        return (
            f"look at it again: {self.argv0} submit --status {ref.name}{where}\n"
            f"cancel it:        {self.argv0} submit --cancel {ref.name}{where}"
        )

    # -- steps ----------------------------------------------------------------------------

    async def _drive(self, ref: ObjectRef) -> bool:
        """Run the submission side until it has nothing left to do (retrying what asks for
        it); False when the deadline passed or Ctrl-C came first."""
        while True:
            try:
                await self.controller.reconcile(ref)
                return True
            except RetryLater as exc:
                if self.store.load(ref.namespace, ref.name) is None:
                    return True
                remaining = self._remaining()
                if remaining <= 0:
                    self.say(f"not done within --timeout {self.options.timeout:g} s: {exc}")
                    return False
                delay = min(exc.delay, remaining)
                self.say(f"retrying in {delay:.1f} s: {exc}")
                if await self.interrupt.sleep(delay):
                    return False

    async def _follow(self, ref: ObjectRef) -> bool:
        """Poll until the phase is final, submitting the retries the job's rules schedule on
        the way; False when the deadline passed or Ctrl-C came first."""
        poller = Poller(self.controller)
        interval = self.settings.poll_interval
        while True:
            body = self.store.load(ref.namespace, ref.name)
            if body is None:
                return True
            status = SlurmJobStatus.parse(body.get("status"))
            step = next_step(status)
            if step is Step.DONE or is_lost(status):
                return True
            if step is not Step.TRACK:  # a scheduled retry (or a submission to finish)
                if not await self._drive(ref):
                    return False
                continue
            if not self.controller.registry.is_followed(ref.uid):
                self.controller.observe_body(body)
                if not self.controller.registry.is_followed(ref.uid):
                    return True  # nothing left to follow
            remaining = self._remaining()
            if remaining <= 0:
                self.say(f"not final within --timeout {self.options.timeout:g} s")
                return False
            if await self.interrupt.sleep(min(interval, remaining)):
                return False
            await poller.cycle()

    async def _finalize(self, ref: ObjectRef) -> dict[str, Any] | None:
        """Cancel the job if it is not final and clean up (the operator's deletion path)."""
        body = self.store.load(ref.namespace, ref.name)
        for attempt in range(_FINALIZE_TRIES):
            if body is None:
                return None
            try:
                await self.controller.finalize(body)
                break
            except RetryLater as exc:
                if attempt == _FINALIZE_TRIES - 1:
                    raise
                self.say(f"retrying in {exc.delay:.1f} s: {exc}")
                await asyncio.sleep(exc.delay)
            body = self.store.load(ref.namespace, ref.name)
        await self._record_end(ref)
        return self.store.load(ref.namespace, ref.name)

    async def _record_end(self, ref: ObjectRef) -> None:
        """After a cancel: fold the job's final state into the status as the poller would
        (finalize ends the job and archives the log tails, but leaves the phase to the poller,
        which is gone here)."""
        body = self.store.load(ref.namespace, ref.name)
        status = SlurmJobStatus.parse((body or {}).get("status"))
        attempt = status.current_attempt
        if body is None or attempt is None or attempt.job_id is None:
            return
        if status.phase is not None and status.phase.is_terminal:
            return
        try:
            client = await self.controller.slurm()
            views = await client.get_job(client.lifecycle_ref(attempt.job_id, attempt.sluid))
        except SlurmError as exc:
            log.warning("cannot read the final state of Slurm job %s: %s", attempt.job_id, exc)
            return
        if views:
            tracked = Tracked(ref, attempt.job_id, attempt.sluid, attempt.staging_dir)
            await self.controller.refresh(tracked, views)

    async def _interrupted(self, ref: ObjectRef) -> LocalResult:
        body = self.store.load(ref.namespace, ref.name)
        if _never_submitted(body):
            self.say("interrupted before anything was submitted")
            self._forget(ref)
            return LocalResult(body, interrupted=True, removed=True)
        job = _job_text(body)
        if self.options.cancel_on_interrupt:
            self.say(f"interrupted: cancelling {job}")
            body = await self._finalize(ref)
            self._forget(ref)
            return LocalResult(body, interrupted=True, removed=True)
        self.say(f"interrupted: {job} is left as it is\n{self._hint(ref)}")
        return LocalResult(body, interrupted=True)

    def _timed_out(self, ref: ObjectRef) -> LocalResult:
        body = self.store.load(ref.namespace, ref.name)
        if _never_submitted(body):
            self.say("nothing was submitted")
            self._forget(ref)
            return LocalResult(body, timed_out=True, removed=True)
        self.say(f"{_job_text(body)} is left as it is\n{self._hint(ref)}")
        return LocalResult(body, timed_out=True)

    def _forget(self, ref: ObjectRef) -> None:
        """Remove the state file (so the name can be submitted again)."""
        if self.store.remove(ref.namespace, ref.name):
            self.say(
                f"{ref.namespace}/{ref.name}: removed {self.store.path(ref.namespace, ref.name)}"
            )

    # -- commands ---------------------------------------------------------------------------

    async def submit(self, manifest: Mapping[str, Any], namespace: str, name: str) -> LocalResult:
        try:
            body = self.store.create(new_object(manifest, namespace, name))
        except FileExistsError as exc:
            old = self.store.load(namespace, name)
            phase = SlurmJobStatus.parse((old or {}).get("status")).phase
            raise LocalInputError(
                f"metadata.name: {namespace}/{name} was already submitted "
                f"(phase {phase.value if phase else 'none'}, "
                f"state in {self.store.path(namespace, name)}); see it with "
                f"`submit --status {name} -n {namespace}`, forget it with "
                f"`submit --cancel {name} -n {namespace}`"
            ) from exc
        ref = ObjectRef.of(body)
        self.say(f"{namespace}/{name}: uid {ref.uid}, state {self.store.path(namespace, name)}")
        done = await self._drive(ref)
        if self.interrupt.fired:
            return await self._interrupted(ref)
        if not done:
            return self._timed_out(ref)
        if self.options.wait:
            done = await self._follow(ref)
            if self.interrupt.fired:
                return await self._interrupted(ref)
            if not done:
                return self._timed_out(ref)
        return LocalResult(self.store.load(namespace, name))

    async def status(self, namespace: str, name: str) -> LocalResult:
        body = self._existing(namespace, name)
        ref = ObjectRef.of(body)
        status = SlurmJobStatus.parse(body.get("status"))
        self.controller.observe_body(body)
        if next_step(status) in (Step.ADOPT, Step.CONFIRM, Step.RETRY):
            # A submission to confirm (or to find, its answer lost), or a retry that is due.
            try:
                await self.controller.reconcile(ref)
            except RetryLater as exc:
                self.say(f"not now: {exc}")
        if self.options.wait:
            done = await self._follow(ref)
            if self.interrupt.fired:
                return await self._interrupted(ref)
            if not done:
                return self._timed_out(ref)
        elif self.controller.registry.is_followed(ref.uid):
            await Poller(self.controller).cycle()
        return LocalResult(self.store.load(namespace, name))

    async def cancel(self, namespace: str, name: str) -> LocalResult:
        body = self._existing(namespace, name)
        ref = ObjectRef.of(body)
        final = await self._finalize(ref)
        self._forget(ref)
        return LocalResult(final or body, removed=True)

    def _existing(self, namespace: str, name: str) -> dict[str, Any]:
        body = self.store.load(namespace, name)
        if body is None:
            raise LocalInputError(
                f"{namespace}/{name}: nothing was submitted under that name "
                f"(no {self.store.path(namespace, name)})"
            )
        return body


@contextlib.contextmanager
def logging_to(err: TextIO, verbose: bool) -> Iterator[None]:
    """The core's warnings (and with -v its progress) as lines on `err` while it runs."""
    logger = logging.getLogger("slurmjob_operator")
    handler = logging.StreamHandler(err)
    handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO if verbose else logging.WARNING)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
