"""benchmarks/cuda_timing on a fake clock: round-robin order, medians, and ratios that survive a clock that slows
down during the run (what one-variant-at-a-time timing gets wrong); steady-state timing on a fake power-capped GPU
(each variant at its own clock); the nvidia-smi log averaging."""
import datetime

from benchmarks.cuda_timing import add_timing_args, interleaved_ms, make_timer, smi_means, steady_ms


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


class PowerCappedGpu(FakeClock):
    """A GPU under a power cap: each variant, run alone, settles at its own speed (work units per ms), and the
    speed moves a fraction `alpha` of the way to the running variant's own speed with every call."""

    def __init__(self, own_speed, alpha=0.2):
        super().__init__()
        self.own, self.alpha, self.speed = own_speed, alpha, 1.0

    def work(self, name, units):
        def call():
            self.calls.append(name)
            self.now += units / self.speed
            self.speed += (self.own[name] - self.speed) * self.alpha
        return call


def test_steady_state_gives_each_variant_its_own_clock_where_round_robin_shares_one():
    """bf16 (3 units) holds speed 1.42 alone, fp8 (2 units) 1.52: alone, their times are 3/1.42 and 2/1.52 ms, a
    ratio of 1.5 * 1.52 / 1.42 = 1.606; round-robin calls run at the mix's speed and read ~1.5."""
    own = {"bf16": 1.42, "fp8": 1.52}
    g = PowerCappedGpu(own)
    windows = {}
    fns = {"bf16": [g.work("bf16", 3.0)], "fp8": [g.work("fp8", 2.0)]}
    res = steady_ms(fns, rounds=3, settle_s=0.2, measure_s=0.1, event=g.event, synchronize=lambda: None,
                    clock=lambda: g.now / 1e3, windows=windows)
    steady = res["bf16"][0] / res["fp8"][0]
    assert abs(res["bf16"][0] - 3.0 / 1.42) < 1e-3 and abs(res["fp8"][0] - 2.0 / 1.52) < 1e-3, res
    assert abs(steady - 1.5 * 1.52 / 1.42) < 1e-3, steady
    # each round timed every variant once, in rotating order, over about measure_s after about settle_s alone
    assert [len(windows[v]) for v in fns] == [3, 3]
    for a, b in windows["fp8"]:
        assert 0.09 < b - a < 0.12
    runs = [c for i, c in enumerate(g.calls) if i == 0 or g.calls[i - 1] != c]
    assert runs == ["bf16", "fp8", "bf16", "fp8"]  # rounds bf16 fp8 | fp8 bf16 | bf16 fp8: the order rotates
    g2 = PowerCappedGpu(own)
    rr = interleaved_ms({"bf16": [g2.work("bf16", 3.0)], "fp8": [g2.work("fp8", 2.0)]}, 50, g2.event, lambda: None)
    assert abs(rr["bf16"][0] / rr["fp8"][0] - 1.5) < 0.03  # the mix's clock: float8's clock advantage is gone


def test_steady_state_cycles_the_input_sets_and_times_at_least_one_call():
    g = PowerCappedGpu({"a0": 1.0, "a1": 1.0}, alpha=0.0)
    res = steady_ms({"a": [g.work("a0", 50.0), g.work("a1", 50.0)]}, rounds=1, settle_s=0.1, measure_s=0.001,
                    event=g.event, synchronize=lambda: None, clock=lambda: g.now / 1e3)
    assert g.calls == ["a0", "a1", "a0"] and res["a"] == (50.0, 0.0)  # 2 settle calls (100 ms), then k = 1


def _t(s):
    return datetime.datetime.strptime(s, "%Y/%m/%d %H:%M:%S.%f").timestamp()


def test_smi_means_averages_only_the_samples_inside_the_windows_and_skips_unreadable_ones(tmp_path):
    log = tmp_path / "gpu_clocks.csv"
    log.write_text("2026/11/28 10:50:00.800, 990 MHz, 100.00 W, 40\n"     # before the first window
                   "2026/11/28 10:50:01.000, 1980 MHz, 650.00 W, 50\n"
                   "2026/11/28 10:50:01.100, 1780 MHz, 700.00 W, 51\n"
                   "2026/11/28 10:50:01.150, [N/A], 699.00 W, 51\n"      # no clock reading: skipped
                   "garbage line\n"
                   "2026/11/28 10:50:02.300, 1200 MHz, 300.00 W, 51\n"   # between the windows
                   "2026/11/28 10:50:03.000, 1500 MHz, 690.00 W, 51\n")  # in the second window
    w1 = (_t("2026/11/28 10:50:00.900"), _t("2026/11/28 10:50:01.250"))
    assert smi_means(str(log), [w1]) == {"samples": 2, "sm_mhz": 1880, "watts": 675.0}
    w2 = (_t("2026/11/28 10:50:02.900"), _t("2026/11/28 10:50:03.100"))
    assert smi_means(str(log), [w1, w2]) == {"samples": 3, "sm_mhz": 1753, "watts": 680.0}
    assert smi_means(str(log), [(_t("2026/11/28 11:00:00.000"), _t("2026/11/28 11:00:01.000"))]) == {}


def test_make_timer_picks_the_method_from_the_switches_and_attaches_each_variants_clock(tmp_path):
    import argparse
    ap = argparse.ArgumentParser()
    add_timing_args(ap)
    own = {"bf16": 1.42, "fp8": 1.52}
    g = PowerCappedGpu(own)
    rr, text = make_timer(ap.parse_args([]), event=g.event, synchronize=lambda: None)
    res, clocks = rr({"bf16": [g.work("bf16", 3.0)], "fp8": [g.work("fp8", 2.0)]}, 20)
    assert "round-robin" in text and clocks == {} and abs(res["bf16"][0] / res["fp8"][0] - 1.5) < 0.05
    # steady, with a clock log whose samples cover the fake run's wall-clock span (the fake clock starts near 0 s)
    log = tmp_path / "smi.csv"
    log.write_text("".join(f"{datetime.datetime.fromtimestamp(t / 10).strftime('%Y/%m/%d %H:%M:%S.%f')}, 1500 MHz, "
                           f"690.00 W, 60\n" for t in range(0, 40)))
    g2 = PowerCappedGpu(own)
    st, text = make_timer(ap.parse_args(["--timing", "steady", "--settle-s", "0.2", "--measure-s", "0.1",
                                         "--smi-log", str(log)]),
                          event=g2.event, synchronize=lambda: None, clock=lambda: g2.now / 1e3)
    res, clocks = st({"bf16": [g2.work("bf16", 3.0)], "fp8": [g2.work("fp8", 2.0)]}, 2)
    assert "steady" in text and "0.2 s" in text
    assert abs(res["bf16"][0] / res["fp8"][0] - 1.5 * 1.52 / 1.42) < 1e-3
    assert clocks["bf16"]["sm_mhz"] == 1500 and clocks["fp8"]["samples"] >= 2
