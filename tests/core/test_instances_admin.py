"""An operator's actions on a backend with several instances: the configured name
stands for all of them (``unload``, ``pin``, ``unpin``) or loads one more
(``load``); ``NAME@K`` is one instance, ``NAME@1`` the first alone."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.core.harness import GIB, Harness, gpu, host, of
from yard.core import BackendSpec, Flag, ProfileMeasured, StartBackend
from yard.core.events import AdminLoad, AdminPin
from yard.core.instances import AdminTargets, admin_targets
from yard.core.spec import Profile
from yard.core.views import BackendView

PROFILE = Profile(gpu_bytes=14 * GIB, host_bytes=2 * GIB, load_s=40.0)


def view(
    name: str, state: str, pinned: bool = False, profile: Profile | None = None
) -> BackendView:
    return BackendView(
        name=name,
        state=state,
        gpus=(),
        inflight=0,
        slots=1,
        served=0,
        loaded_at=None,
        pinned=pinned,
        profile=profile,
        last_load_s=None,
        reason="",
    )


def news(
    *states: str, pinned: tuple[bool, ...] = (), profile: Profile | None = PROFILE
) -> list[BackendView]:
    """Views of news, news@2, ... in ``states`` (and a one-instance chat)."""
    names = ["news", *(f"news@{k}" for k in range(2, len(states) + 1))]
    views = [
        view(name, state, pinned[k] if pinned else False, profile)
        for k, (name, state) in enumerate(zip(names, states, strict=True))
    ]
    # The snapshot's order is not the instances' order.
    return [*reversed(views), view("chat", "ready")]


def names(action: str, name: str, views: list[BackendView]) -> tuple[str, ...]:
    targets = admin_targets(action, name, views)
    assert targets is not None
    return targets.names


def test_unload_by_the_configured_name_unloads_every_instance_loaded() -> None:
    views = news("ready", "draining", "stopped", "starting")
    targets = admin_targets("unload", "news", views)
    assert targets == AdminTargets(
        backend="news",
        names=("news", "news@2", "news@4"),
        group=True,
        detail="unloading every instance of news loaded or loading: news, news@2, news@4",
    )


def test_unload_leaves_pinned_instances_and_says_so() -> None:
    views = news("ready", "ready", pinned=(True, False))
    targets = admin_targets("unload", "news", views)
    assert targets is not None and targets.names == ("news@2",)
    assert targets.detail == (
        "unloading every instance of news loaded or loading, except the pinned news: news@2"
    )
    all_pinned = admin_targets("unload", "news", news("ready", "stopped", pinned=(True, False)))
    assert all_pinned is not None and all_pinned.names == ()
    assert all_pinned.detail == "every instance of news loaded is pinned; unpin news first"
    none = admin_targets("unload", "news", news("stopped", "failed"))
    assert none is not None and none.names == ()
    assert none.detail == "no instance of news (news, news@2) is loaded or loading"


@pytest.mark.parametrize(
    ("states", "loads"),
    [
        (("stopped", "stopped"), "news"),
        (("ready", "stopped", "stopped"), "news@2"),
        (("ready", "ready", "failed"), "news@3"),
        (("draining", "stopped"), "news@2"),
        (("failed", "ready"), "news"),
    ],
)
def test_load_by_the_configured_name_loads_the_first_instance_not_loaded(
    states: tuple[str, ...], loads: str
) -> None:
    targets = admin_targets("load", "news", news(*states))
    assert targets is not None and targets.names == (loads,)
    assert targets.detail == f"loading {loads}, the first instance of news not loaded: {loads}"


def test_load_of_a_fully_loaded_backend_does_nothing_and_says_why() -> None:
    targets = admin_targets("load", "news", news("ready", "starting"))
    assert targets is not None and targets.names == ()
    assert targets.detail == "every instance of news (news, news@2) is loaded or loading"


def test_load_never_makes_a_further_instance_take_the_first_load() -> None:
    # news is loading for the first time: its measurement is news@2's profile.
    targets = admin_targets("load", "news", news("starting", "stopped", profile=None))
    assert targets is not None and targets.names == ()
    assert targets.detail == (
        "news@2 waits for the first load of news, which measures the profile every instance shares"
    )


def test_pin_and_unpin_by_the_configured_name_act_on_every_instance_that_changes() -> None:
    views = news("ready", "stopped", "stopped", pinned=(True, False, False))
    assert names("pin", "news", views) == ("news@2", "news@3")
    assert names("unpin", "news", views) == ("news",)
    done = admin_targets("unpin", "news", news("ready", "stopped"))
    assert done is not None and done.names == ()
    assert done.detail == "every instance of news (news, news@2) is unpinned already"


@pytest.mark.parametrize("action", ["load", "unload", "pin", "unpin"])
def test_one_instance_is_addressed_by_its_own_name(action: str) -> None:
    views = news("ready", "ready", "stopped")
    assert admin_targets(action, "news@2", views) == AdminTargets(
        backend="news@2", names=("news@2",)
    )
    assert admin_targets(action, "news@1", views) == AdminTargets(backend="news", names=("news",))
    # A backend with one instance is itself, whatever its state.
    assert admin_targets(action, "chat", views) == AdminTargets(backend="chat", names=("chat",))


@pytest.mark.parametrize("name", ["nope", "news@4", "news@0", "news@02", "chat@1", "chat@2"])
def test_unknown_names_are_none(name: str) -> None:
    assert admin_targets("load", name, news("ready", "ready", "stopped")) is None


# -- the core ---------------------------------------------------------------------------

NEWS = BackendSpec(name="news", gpus=("gpu0", "gpu1"), instances=2)
NEWS_2 = BackendSpec(name="news@2", gpus=("gpu0", "gpu1"), instances=2, instance_of="news")


def test_an_admin_load_of_a_further_instance_waits_for_the_first_load() -> None:
    h = Harness([NEWS, NEWS_2], devices=(gpu("gpu0"), gpu("gpu1"), host()))
    out = h.feed(AdminLoad(backend="news@2"))
    assert not of(StartBackend, out)
    [flag] = of(Flag, out)
    assert flag.reason == (
        "admin load: not loading news@2 now: it waits for the first load of news, which "
        "measures the profile every instance shares; load news first"
    )
    [start] = of(StartBackend, h.feed(AdminLoad(backend="news")))
    assert start.backend == "news" and start.measure


def test_pinned_instances_take_no_first_load_beside_the_first() -> None:
    pinned = [replace(s, pinned=True) for s in (NEWS, NEWS_2)]
    h = Harness(pinned, devices=(gpu("gpu0"), gpu("gpu1"), host()))
    [start] = of(StartBackend, h.feed(AdminPin(backend="news", pinned=True)))
    assert start.backend == "news" and start.measure
    assert not of(StartBackend, h.ready("news", at=40.0))
    out = h.feed(
        ProfileMeasured(backend="news", gpu_bytes=14 * GIB, host_bytes=2 * GIB, load_s=40.0),
        at=42.0,
    )
    [start2] = of(StartBackend, out)
    assert start2.backend == "news@2" and not start2.measure
