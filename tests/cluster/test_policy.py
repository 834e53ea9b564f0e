"""The cluster's claim and routing policy (:mod:`yard.cluster.policy`): pure functions,
tested by hand-made cases and Hypothesis properties."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import yard.cluster.policy as policy_module
from tests.core.harness import GIB, Harness, gpu, host
from yard.cluster.policy import (
    BackendState,
    Hunger,
    LocalBackend,
    Peer,
    Route,
    hungry,
    local_backends,
    room_for,
    route,
)
from yard.core import BackendSpec
from yard.core.events import MemoryMeasured, ProfileMeasured

# -- hungry -------------------------------------------------------------------------


def test_ready_backend_claims_as_many_as_its_free_slots() -> None:
    chat = LocalBackend(name="chat", slots=4, state="ready", running=2, waiting=1)
    assert room_for(chat) == 1
    assert hungry([chat]) == Hunger(claim=("chat",), prefer=("chat",))


def test_full_ready_backend_claims_nothing() -> None:
    chat = LocalBackend(name="chat", slots=2, state="ready", running=2)
    assert room_for(chat) == 0
    assert not hungry([chat])


def test_ahead_lets_a_few_jobs_wait_behind_full_slots() -> None:
    chat = LocalBackend(name="chat", slots=2, state="ready", running=2)
    assert room_for(chat, ahead=1) == 1
    assert hungry([chat], ahead=1).claim == ("chat",)


def test_loading_backend_claims_enough_to_fill_its_slots_and_is_preferred() -> None:
    tts = LocalBackend(name="tts", slots=2, state="loading", waiting=1)
    assert room_for(tts) == 1
    assert hungry([tts]) == Hunger(claim=("tts",), prefer=("tts",))
    assert not hungry([LocalBackend(name="tts", slots=2, state="loading", waiting=2)])


def test_stopped_backend_claims_one_job_to_load_it_and_is_not_preferred() -> None:
    news = LocalBackend(name="news", state="stopped")
    assert room_for(news) == 1
    assert hungry([news]) == Hunger(claim=("news",), prefer=())
    waiting = LocalBackend(name="news", slots=3, state="stopped", waiting=1)
    assert room_for(waiting) == 0


def test_stopped_backend_that_cannot_start_now_claims_nothing() -> None:
    music = LocalBackend(name="music", state="stopped", fits="no")
    assert not hungry([music])


def test_stopped_backend_loaded_on_another_node_is_left_to_it() -> None:
    image = LocalBackend(name="image", state="stopped")
    chat = LocalBackend(name="chat", slots=4, state="ready")
    got = hungry([image, chat], loaded_elsewhere=frozenset({"image", "chat"}))
    # chat is loaded here too: this node still takes its share.
    assert got == Hunger(claim=("chat",), prefer=("chat",))


def test_a_load_that_needs_an_eviction_is_left_to_a_node_with_room() -> None:
    news = LocalBackend(name="news", state="stopped", fits="evict")
    assert hungry([news], room_elsewhere=frozenset({"news"})) == Hunger()
    busy = LocalBackend(name="news", state="stopped", fits="busy")
    assert hungry([busy], room_elsewhere=frozenset({"news"})) == Hunger()
    # No other node has room: evicting here is the way.
    assert hungry([news]).claim == ("news",)
    # It fits here in free memory: no reason to wait for the other node.
    free = LocalBackend(name="news", state="stopped", fits="free")
    assert hungry([free], room_elsewhere=frozenset({"news"})).claim == ("news",)


def test_claim_lists_are_sorted_and_prefer_is_within_claim() -> None:
    got = hungry(
        [
            LocalBackend(name="tts", slots=2, state="ready"),
            LocalBackend(name="chat", slots=4, state="ready", running=1),
            LocalBackend(name="image", state="stopped"),
            LocalBackend(name="music", state="ready", running=1),
        ]
    )
    assert got == Hunger(claim=("chat", "image", "tts"), prefer=("chat", "tts"))


def test_bad_records_are_refused_with_the_backend_named() -> None:
    with pytest.raises(ValueError, match="chat: slots"):
        LocalBackend(name="chat", slots=0)
    with pytest.raises(ValueError, match="chat: running"):
        LocalBackend(name="chat", running=-1)
    with pytest.raises(ValueError, match="ahead"):
        hungry([], ahead=-1)


# -- route --------------------------------------------------------------------------


def _peer(name: str, **kw: object) -> Peer:
    kw.setdefault("serves", frozenset({"chat", "news"}))
    return Peer(name=name, **kw)  # type: ignore[arg-type]


def test_ready_node_wins_over_a_load_anywhere() -> None:
    nodes = [_peer("a", free_mib=80_000), _peer("b", ready=frozenset({"news"}), free_mib=0)]
    got = route("news", nodes, "a")
    assert (got.node, got.forward) == ("b", True)
    assert "ready on b" in got.reason


def test_ready_here_serves_here_when_waiting_is_equal() -> None:
    nodes = [_peer("b", ready=frozenset({"chat"})), _peer("a", ready=frozenset({"chat"}))]
    assert route("chat", nodes, "a") == Route(node="a", forward=False, reason="chat is ready on a")


def test_fewer_waiting_wins_among_ready_nodes() -> None:
    nodes = [
        _peer("a", ready=frozenset({"chat"}), waiting={"chat": 3}),
        _peer("b", ready=frozenset({"chat"}), waiting={"chat": 1}),
    ]
    assert route("chat", nodes, "a").node == "b"


def test_a_node_loading_the_model_wins_over_a_second_load() -> None:
    nodes = [_peer("a", free_mib=80_000), _peer("b", loading=frozenset({"news"}))]
    got = route("news", nodes, "a", need_mib=13_000)
    assert (got.node, got.reason) == ("b", "news is loading on b")
    ready = [*nodes, _peer("c", ready=frozenset({"news"}), waiting={"news": 4})]
    assert route("news", ready, "a").node == "c"


def test_without_a_ready_node_the_one_with_room_to_load_wins() -> None:
    nodes = [_peer("a", free_mib=4_000), _peer("b", free_mib=20_000)]
    got = route("news", nodes, "a", need_mib=13_000)
    assert (got.node, got.forward) == ("b", True)
    assert "free memory" in got.reason
    # Neither has room: the one with the most free memory (least to evict).
    got = route("news", nodes, "a", need_mib=30_000)
    assert got.node == "b"
    assert "free memory" not in got.reason


def test_forwarded_request_is_served_here_whatever_the_registry_says() -> None:
    nodes = [_peer("a"), _peer("b", ready=frozenset({"news"}))]
    got = route("news", nodes, "a", forwarded=True)
    assert (got.node, got.forward) == ("a", False)


def test_gone_nodes_and_unknown_models_are_served_here() -> None:
    nodes = [_peer("a", serves=frozenset()), _peer("b", up=False, ready=frozenset({"news"}))]
    got = route("news", nodes, "a")
    assert (got.node, got.forward) == ("a", False)
    assert "no live node serves news" in got.reason


def test_a_peer_cannot_have_ready_what_it_does_not_serve() -> None:
    with pytest.raises(ValueError, match="node a: ready and loading"):
        Peer(name="a", ready=frozenset({"x"}))


# -- properties ---------------------------------------------------------------------

NAMES = ("chat", "image", "music", "news", "tts")


@st.composite
def some_backends(draw: st.DrawFn) -> list[LocalBackend]:
    names = draw(st.lists(st.sampled_from(NAMES), unique=True, max_size=len(NAMES)))
    out = []
    for name in names:
        state: BackendState = draw(st.sampled_from(("stopped", "loading", "ready")))
        slots = draw(st.integers(1, 4))
        out.append(
            LocalBackend(
                name=name,
                slots=slots,
                state=state,
                running=0 if state != "ready" else draw(st.integers(0, slots)),
                waiting=draw(st.integers(0, 5)),
                fits=draw(st.sampled_from(("free", "evict", "busy", "no"))),
            )
        )
    return out


@given(
    backends=some_backends(),
    elsewhere=st.frozensets(st.sampled_from(NAMES)),
    room=st.frozensets(st.sampled_from(NAMES)),
    ahead=st.integers(0, 3),
)
@settings(max_examples=300, deadline=None)
def test_hungry_claims_only_served_backends_with_room(
    backends: list[LocalBackend], elsewhere: frozenset[str], room: frozenset[str], ahead: int
) -> None:
    got = hungry(backends, loaded_elsewhere=elsewhere, room_elsewhere=room, ahead=ahead)
    by_name = {b.name: b for b in backends}
    assert set(got.claim) <= set(by_name)
    assert set(got.prefer) <= set(got.claim)
    assert list(got.claim) == sorted(got.claim) and list(got.prefer) == sorted(got.prefer)
    for name in got.claim:
        backend = by_name[name]
        assert room_for(backend, ahead=ahead) > 0
        if backend.state == "stopped":
            # One job to load it, only if it can start, nobody else has it loaded, and
            # nobody else could load it without the eviction this node would need.
            assert backend.fits != "no" and backend.waiting == 0 and name not in elsewhere
            assert backend.fits == "free" or name not in room
        else:
            # Never more waiting here than its slots (plus ``ahead``) can start.
            assert backend.running + backend.waiting < backend.slots + ahead
            assert name in got.prefer
    # Same records, same answer, in any order.
    again = hungry(
        list(reversed(backends)), loaded_elsewhere=elsewhere, room_elsewhere=room, ahead=ahead
    )
    assert again == got


@given(backends=some_backends())
@settings(max_examples=200, deadline=None)
def test_claiming_until_not_hungry_never_holds_more_than_can_start(
    backends: list[LocalBackend],
) -> None:
    """A node that claims one job at a time and asks again stops by itself: it ends
    holding at most one job per stopped backend and at most the free slots of the
    others (no hoarding)."""
    state = {b.name: b for b in backends}
    start = dict(state)
    for _ in range(100):
        got = hungry(list(state.values()))
        if not got:
            break
        name = got.claim[0]
        b = state[name]
        state[name] = LocalBackend(
            name=b.name,
            slots=b.slots,
            state=b.state,
            running=b.running,
            waiting=b.waiting + 1,
            fits=b.fits,
        )
    else:
        pytest.fail("hungry never became satisfied")
    for name, b in state.items():
        claimed = b.waiting - start[name].waiting
        if b.state == "stopped":
            assert claimed <= 1
        else:
            assert claimed <= max(0, b.slots - start[name].running - start[name].waiting)


@st.composite
def peers(draw: st.DrawFn) -> list[Peer]:
    names = draw(st.lists(st.sampled_from("abcde"), unique=True, min_size=1))
    out = []
    for name in names:
        serves = draw(st.frozensets(st.sampled_from(NAMES)))
        ready = draw(st.frozensets(st.sampled_from(sorted(serves)))) if serves else frozenset()
        loading = (
            draw(st.frozensets(st.sampled_from(sorted(serves - ready))))
            if serves - ready
            else frozenset()
        )
        waiting = draw(st.dictionaries(st.sampled_from(NAMES), st.integers(0, 5)))
        out.append(
            Peer(
                name=name,
                up=draw(st.booleans()),
                serves=serves,
                ready=ready,
                loading=loading,
                waiting=waiting,
                free_mib=draw(st.sampled_from((0.0, 4_000.0, 12_000.0, 24_000.0))),
            )
        )
    return out


@given(
    nodes=peers(),
    model=st.sampled_from(NAMES),
    here=st.sampled_from("abcde"),
    need=st.none() | st.sampled_from((2_000.0, 13_000.0)),
)
@settings(max_examples=300, deadline=None)
def test_route_is_deterministic_and_picks_a_live_server(
    nodes: list[Peer], model: str, here: str, need: float | None
) -> None:
    got = route(model, nodes, here, need_mib=need)
    assert got == route(model, list(reversed(nodes)), here, need_mib=need)
    assert got.forward == (got.node != here)
    live = [n for n in nodes if n.up and model in n.serves]
    if not live:
        assert got.node == here and not got.forward
        return
    chosen = next(n for n in live if n.name == got.node)
    if any(model in n.ready for n in live):
        assert model in chosen.ready
        best_wait = min(n.waiting.get(model, 0) for n in live if model in n.ready)
        assert chosen.waiting.get(model, 0) == best_wait
    elif any(model in n.loading for n in live):
        assert model in chosen.loading


@given(
    nodes=peers(),
    model=st.sampled_from(NAMES),
    here=st.sampled_from("abcde"),
)
@settings(max_examples=200, deadline=None)
def test_a_forwarded_request_is_never_routed_away(nodes: list[Peer], model: str, here: str) -> None:
    got = route(model, nodes, here, forwarded=True)
    assert (got.node, got.forward) == (here, False)


@given(nodes=peers(), model=st.sampled_from(NAMES))
@settings(max_examples=200, deadline=None)
def test_the_node_a_request_is_forwarded_to_would_keep_it_itself(
    nodes: list[Peer], model: str
) -> None:
    """No ping-pong even without the forwarded flag: the node chosen from any asker
    chooses itself on the same records."""
    for asker in nodes:
        first = route(model, nodes, asker.name)
        if first.forward:
            assert route(model, nodes, first.node) == Route(
                node=first.node, forward=False, reason=first.reason
            )


def test_policy_does_no_io() -> None:
    """Like yard/core: the standard library's pure modules only."""
    tree = ast.parse(Path(policy_module.__file__).read_text())
    modules = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert modules <= {"__future__", "collections", "dataclasses", "typing", "yard"}
    yard_modules = {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("yard")
    }
    assert all(m.startswith("yard.core") for m in yard_modules), yard_modules


# -- local_backends, from the real core's snapshot ------------------------------------


def _node() -> Harness:
    backends = [
        BackendSpec(name="news", gpus=("gpu0",)),
        BackendSpec(name="chat", gpus=("gpu0",), slots=4),
        BackendSpec(name="image", gpus=("gpu0",)),
    ]
    return Harness(
        backends,
        (gpu(gib=24), host()),
        profiles={"news": (13, 2, 40), "chat": (4, 1, 12), "image": (8, 3, 25)},
    )


def _local(h: Harness) -> dict[str, LocalBackend]:
    snap = h.s.snapshot(h.now, limit=0)
    gpus_of = {"news": ("gpu0",), "chat": ("gpu0",), "image": ("gpu0",)}
    got = local_backends(snap, gpus_of=gpus_of, margin=1.10)
    return {b.name: b for b in got}


def test_local_backends_reads_states_and_counts_from_the_snapshot() -> None:
    h = _node()
    h.arrive("c1", "chat", at=0.0)
    h.arrive("c2", "chat", at=0.0)
    local = _local(h)
    assert local["chat"] == LocalBackend(
        name="chat", slots=4, state="loading", waiting=2, fits="no"
    )
    # One load at a time on gpu0: nothing else can start while chat loads.
    assert local["news"].fits == "no" and local["image"].fits == "no"
    h.ready("chat", at=12.0)
    local = _local(h)
    assert local["chat"] == LocalBackend(name="chat", slots=4, state="ready", running=2, fits="no")
    assert local["news"] == LocalBackend(name="news", state="stopped", fits="free")


def test_a_load_that_fits_only_after_stopping_idle_backends_is_evict() -> None:
    h = _node()
    h.load("chat", "c1", at=0.0)
    h.finish("c1", at=20.0)
    h.load("news", "n1", at=21.0)
    # 24 GiB - chat 4.4 - news 14.3 = 5.3 GiB free: image (8.8) needs idle chat gone.
    assert _local(h)["image"].fits == "evict"
    h.arrive("c2", "chat", at=70.0)
    # chat busy, news busy: image can start only once one of them has drained.
    assert _local(h)["image"].fits == "busy"
    # (chat has free slots: it is claimed for too.)
    assert hungry(list(_local(h).values())).claim == ("chat", "image")
    elsewhere = hungry(list(_local(h).values()), room_elsewhere=frozenset({"image"}))
    assert elsewhere.claim == ("chat",)


def test_a_stopped_backend_with_a_context_range_fits_at_its_smallest_start() -> None:
    # Measured at 32768 tokens: 20 GiB, 4 GiB fixed + 16 GiB of KV cache.
    per_token = 16 * GIB / 32768
    h = Harness(
        [BackendSpec(name="llm", gpus=("gpu0",), context=(4096, 32768))],
        (gpu(gib=24), host()),
    )
    h.feed(
        ProfileMeasured(
            backend="llm",
            gpu_bytes=20 * GIB,
            host_bytes=GIB,
            load_s=10,
            source="stored",
            context=32768,
            gpu_per_token=per_token,
            host_per_token=0.0,
        )
    )
    h.feed(MemoryMeasured(device="gpu0", used_bytes=10 * GIB, backends=()), at=0.0)
    snap = h.s.snapshot(h.now, limit=0)
    gpus_of = {"llm": ("gpu0",)}
    # 14 GiB free: the measured 20 GiB (x 1.1) does not fit, the required
    # 4 GiB + 2 GiB of cache at 4096 tokens does, as the core would start it.
    fixed = local_backends(snap, gpus_of=gpus_of, margin=1.10)
    assert fixed[0].fits == "no"
    ranged = local_backends(
        snap, gpus_of=gpus_of, margin=1.10, ranges_of={"llm": ((4096, 32768), None)}
    )
    assert ranged[0].fits == "free"
