//! The rescue scenarios of seed 001 §6.3 in the simulator, with the real rescue core: the
//! PlanetLab DSL origin (Fig. 10) and the LAN run with five rescue servers (Fig. 11), with
//! steps shortened to keep the test quick.

use std::time::Duration;

use switchyard_rescue::State;
use switchyard_sim::rescue::{simulate_rescue, RescueScenario, ServerSpec};

fn server(name: &str, d_out_kbps: f64) -> ServerSpec {
    ServerSpec {
        name: name.to_string(),
        d_out_kbps,
    }
}

/// Ten files of 6 KB on average (§6.3.3).
fn files_6k() -> Vec<u64> {
    vec![4096, 5120, 6144, 7168, 8192, 4096, 5120, 6144, 7168, 8192]
}

#[test]
fn dsl_origin_gains_an_order_of_magnitude() {
    let secs = |s| Duration::from_secs(s);
    // Without rescue: 1 → 20 req/s in steps of 1.
    let mut alone = RescueScenario::new(
        server("gtidsl1.example", 53.9),
        vec![],
        files_6k(),
        RescueScenario::steps(1.0, 20.0, 1.0, secs(20)),
    );
    alone.enabled = false;
    let a = simulate_rescue(&alone).unwrap();
    // D_out / (F + header) = 53900 / 6394 = 8.4 req/s.
    assert!((8.0..=10.0).contains(&a.r_max), "R_max alone {}", a.r_max);
    assert!(a.steps.iter().all(|s| s.redirected == 0));
    assert_eq!(a.sos_sent, 0);

    // With a rescue server of 2000 kB/s: 4 → 200 req/s in steps of 4.
    let with = RescueScenario::new(
        server("gtidsl1.example", 53.9),
        vec![server("maglev.example", 2000.0)],
        files_6k(),
        RescueScenario::steps(4.0, 200.0, 4.0, secs(20)),
    );
    let w = simulate_rescue(&with).unwrap();
    let bound = 53_900.0 / 468.0; // D_out / A_redi = 115 req/s
    assert!(
        w.r_max >= 0.85 * bound,
        "R_max {} of bound {bound}",
        w.r_max
    );
    // A step counts as supported with up to 10% of its requests lost, so R_max can pass the
    // bound by as much.
    assert!(
        w.r_max <= bound / 0.9,
        "R_max {} above D_out / A_redi",
        w.r_max
    );
    eprintln!(
        "alone: R_max {} D_max {:.0}; rescued: R_max {} D_max {:.0}; bound {bound:.0}",
        a.r_max, a.d_max, w.r_max, w.d_max
    );
    assert!(w.r_max >= 8.0 * a.r_max, "{} vs {}", w.r_max, a.r_max);
    assert!(w.d_max >= 8.0 * a.d_max, "{} vs {}", w.d_max, a.d_max);
    // Redirects start at the first step whose load passes T_high × D_out: 8 req/s × 6394 B.
    let first = w.steps.iter().find(|s| s.redirected > 0).unwrap();
    assert_eq!(first.rate, 8.0);
    assert_eq!(w.allocations, vec![0]);
}

#[test]
fn lan_origin_with_five_rescue_servers() {
    let secs = |s| Duration::from_secs(s);
    let mut profile = RescueScenario::steps(100.0, 2000.0, 100.0, secs(10));
    profile.push((2000.0, secs(30)));
    profile.push((50.0, secs(60)));
    let mut scn = RescueScenario::new(
        server("bjs.example", 1000.0),
        vec![
            server("ankara.example", 2000.0),
            server("maglev.example", 10000.0),
            server("delhi.example", 4000.0),
            server("ottawa.example", 5000.0),
            server("beirut.example", 3000.0),
        ],
        vec![4096; 10],
        profile,
    );
    scn.tail = secs(60);
    let r = simulate_rescue(&scn).unwrap();

    // Allocated one at a time, largest free capacity first.
    let order: Vec<&str> = r
        .allocations
        .iter()
        .map(|&i| scn.rescuers[i].name.as_str())
        .collect();
    let expected = [
        "maglev.example",
        "ottawa.example",
        "delhi.example",
        "beirut.example",
        "ankara.example",
    ];
    assert!(order.len() >= 3, "{order:?}");
    assert_eq!(order[..], expected[..order.len()]);

    // Rescue rates in proportion to D_redi (weighted round robin): at the top, each busy
    // server carries the same share of its D_init = D_resc × T_coff within ±20%.
    let d_init: Vec<f64> = scn
        .rescuers
        .iter()
        .map(|s| s.d_out_kbps * 1000.0 * 0.5 * 0.9)
        .collect();
    for s in r
        .samples
        .iter()
        .filter(|s| s.requests >= 2000 && s.rescuers >= 3)
    {
        let shares: Vec<f64> = s
            .rescuer_bps
            .iter()
            .zip(&d_init)
            .filter(|(b, _)| **b > 0.0)
            .map(|(b, d)| b / d)
            .collect();
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        for x in &shares {
            assert!((x / mean - 1.0).abs() <= 0.2, "t={} shares {shares:?}", s.t);
        }
    }
    // Up to 2000 req/s, at most 10% time out in any step.
    for s in &r.steps {
        assert!(
            !s.overloaded,
            "step {} req/s: {} of {} timed out",
            s.rate, s.timeouts, s.requests
        );
    }
    // The origin's rate never exceeds D_out and stays near T_high × D_out = 750 kB/s while it
    // redirects (and not every request is redirected).
    for s in &r.samples {
        assert!(
            s.origin_bps <= 1_000_000.0 * 1.01,
            "t={} {}",
            s.t,
            s.origin_bps
        );
    }
    let plateau: Vec<f64> = r
        .samples
        .iter()
        .filter(|s| {
            s.redirected > 0 && s.redirected < s.requests && s.requests >= 400 && s.requests <= 1400
        })
        .map(|s| s.origin_bps)
        .collect();
    assert!(plateau.len() >= 20, "{}", plateau.len());
    let mean = plateau.iter().sum::<f64>() / plateau.len() as f64;
    assert!((675_000.0..=825_000.0).contains(&mean), "plateau {mean}");
    // Almost everything is redirected at the top.
    let top = r
        .samples
        .iter()
        .filter(|s| s.requests >= 1900)
        .collect::<Vec<_>>();
    assert!(!top.is_empty());
    for s in top {
        assert!(s.redirected as f64 >= 0.9 * s.requests as f64, "t={}", s.t);
    }
    // The crowd goes: every relationship is released and every server is normal again.
    assert!(r.all_normal_at_end, "{:?}", r.releases);
    assert_eq!(r.samples.last().unwrap().origin_state, State::Normal);
    assert!(
        r.releases.get("complete-release").copied().unwrap_or(0) >= 1,
        "{:?}",
        r.releases
    );
}

#[test]
fn invalid_scenarios_are_refused() {
    let mut s = RescueScenario::new(server("a.example", 100.0), vec![], vec![], vec![]);
    assert!(simulate_rescue(&s).is_err());
    s.files = vec![1];
    s.origin.d_out_kbps = 0.0;
    assert!(simulate_rescue(&s).is_err());
}
