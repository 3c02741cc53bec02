"""benchmarks/cuda_timing.interleaved_ms on a fake clock: round-robin order, medians, and ratios that survive a
clock that slows down during the run (what one-variant-at-a-time timing gets wrong)."""
from benchmarks.cuda_timing import interleaved_ms


class FakeClock:
    """Work of `units` takes units * slowdown ms; the GPU slows by `drift` per call (thermal throttling)."""

    def __init__(self, drift=0.0):
        self.now, self.slow, self.drift, self.calls = 0.0, 1.0, drift, []

    def work(self, name, units):
        def call():
            self.calls.append(name)
            self.now += units * self.slow
            self.slow += self.drift
        return call

    def event(self):
        clock = self

        class Ev:
            def record(self):
                self.t = clock.now

            def elapsed_time(self, other):
                return other.t - self.t
        return Ev()


def test_round_robin_order_and_medians():
    c = FakeClock()
    fns = {"a": [c.work("a0", 2.0), c.work("a1", 2.0)], "b": [c.work("b", 1.0)]}
    res = interleaved_ms(fns, rounds=4, event=c.event, synchronize=lambda: None)
    assert c.calls == ["a0", "b", "b", "a1", "a0", "b", "b", "a1"]  # the order rotates each round
    assert res["a"] == (2.0, 0.0) and res["b"] == (1.0, 0.0)


def test_ratio_holds_under_drift_and_iqr_reports_spread():
    c = FakeClock(drift=0.01)  # 1% slower per call: the last calls run ~2x slower than the first
    fns = {"bf16": [c.work("bf16", 3.0)], "fp8": [c.work("fp8", 2.0)]}
    res = interleaved_ms(fns, rounds=50, event=c.event, synchronize=lambda: None)
    ratio = res["bf16"][0] / res["fp8"][0]
    assert abs(ratio - 1.5) < 0.02, ratio
    assert res["bf16"][1] > 0.3  # the drift shows up as spread, not as a wrong ratio
    # timed one after the other, the same clock gives a ratio off by ~1.5x
    c2 = FakeClock(drift=0.01)
    seq = {**interleaved_ms({"bf16": [c2.work("bf16", 3.0)]}, 50, c2.event, lambda: None),
           **interleaved_ms({"fp8": [c2.work("fp8", 2.0)]}, 50, c2.event, lambda: None)}
    assert abs(seq["bf16"][0] / seq["fp8"][0] - 1.5) > 0.3


def test_even_count_median_is_the_mean_of_the_middle_two():
    c = FakeClock()
    times = iter([1.0, 4.0, 2.0, 3.0])
    fns = {"v": [lambda: setattr(c, "now", c.now + next(times))]}
    med, iqr = interleaved_ms(fns, rounds=4, event=c.event, synchronize=lambda: None)["v"]
    assert med == 2.5 and iqr == (4.0 - 2.0) / 2.5



def test_rotation_cancels_a_position_penalty():
    """The first kernel of every round runs 10% slower (e.g. after a host gap): identical variants must read the
    same; a fixed order would charge the penalty to the first variant in every round (median 2.2 against 2.0)."""
    c = FakeClock()

    def work(name):
        def call():
            c.now += 2.0 * (1.1 if len(c.calls) % 3 == 0 else 1.0)
            c.calls.append(name)
        return call

    res = interleaved_ms({v: [work(v)] for v in "xyz"}, rounds=30, event=c.event, synchronize=lambda: None)
    assert c.calls[:6] == ["x", "y", "z", "y", "z", "x"]
    assert all(res[v][0] == 2.0 for v in "xyz"), res
