//! `numapin bench` without a GPU: the host figures, as valid JSON, with a
//! note that GPU figures need a CUDA driver.
#![allow(clippy::unwrap_used)] // tests and examples fail loudly

use std::process::Command;

#[test]
fn bench_json_without_a_gpu_gives_the_host_figures() {
    let o = Command::new(env!("CARGO_BIN_EXE_numapin"))
        .args([
            "bench",
            "--json",
            "--no-cuda",
            "--reps",
            "2",
            "--size",
            "16M",
            "--region-sizes",
            "16M,8M",
        ])
        .env("NUMAPIN_NO_CUDA", "1")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("valid JSON");
    assert_eq!(v["schema_version"], 1);
    assert!(v["machine"]["cpus"].as_u64().unwrap() >= 1);
    let results = v["results"].as_array().unwrap();
    let by = |name: &str| {
        results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("{name} missing: {results:?}"))
    };
    for (name, unit) in [
        ("arena_alloc_free", "ns"),
        ("region_create_per_gib", "ms"),
        ("arena_overhead", "ratio"),
        ("loader", "GB/s"),
    ] {
        let r = by(name);
        assert_eq!(r["unit"], unit);
        let (med, min, max) = (
            r["median"].as_f64().unwrap(),
            r["min"].as_f64().unwrap(),
            r["max"].as_f64().unwrap(),
        );
        assert!(min <= med && med <= max && med > 0.0, "{name}: {r}");
        assert!(r["reps"].as_u64().unwrap() >= 1);
    }
    assert!(by("arena_overhead")["median"].as_f64().unwrap() <= 1.10);
    assert_eq!(by("loader")["mode"], "host");
    // Producer scaling from one worker, each figure a positive rate.
    let scaling: Vec<_> = results
        .iter()
        .filter(|r| r["name"] == "loader_producers_scaling")
        .collect();
    assert!(scaling.iter().any(|r| r["workers"] == 1), "{scaling:?}");
    assert!(
        scaling
            .iter()
            .all(|r| r["median"].as_f64().unwrap() > 0.0 && r["unit"] == "GB/s"),
        "{scaling:?}"
    );
    // Pinning: the creation of each size per step, all pages on the node,
    // the release, and the two placement checks.
    for bytes in [16 << 20, 8 << 20] {
        let of = |name: &str| {
            results
                .iter()
                .filter(|r| r["name"] == name && r["region_bytes"] == bytes)
                .collect::<Vec<_>>()
        };
        let create = of("pin_create_per_gib");
        assert_eq!(create.len(), 1, "{create:?}");
        assert_eq!(create[0]["backend"], "mapped");
        assert_eq!(create[0]["pages"], bytes / 4096);
        assert_eq!(create[0]["pages_on_node"], bytes / 4096);
        let steps: Vec<_> = of("pin_step_per_gib")
            .iter()
            .map(|r| r["step"].clone())
            .collect();
        for step in ["map", "populate", "lock", "verify"] {
            assert!(steps.contains(&step.into()), "{step} missing: {steps:?}");
        }
        assert_eq!(of("pin_release_per_gib").len(), 1);
    }
    let checks: Vec<_> = results
        .iter()
        .filter(|r| r["name"] == "pin_verify_per_gib")
        .map(|r| r["method"].as_str().unwrap().to_string())
        .collect();
    assert!(
        checks.contains(&"move_pages".into()) && checks.contains(&"numa_maps".into()),
        "{checks:?}"
    );
    assert_eq!(by("loader")["verified"], true);
    assert!(
        results.iter().all(|r| r["name"] != "h2d"),
        "no GPU figures without a driver"
    );
    let notes = v["notes"].as_array().unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.as_str().unwrap().contains("CUDA driver")),
        "{notes:?}"
    );
}

#[test]
fn bench_refuses_bad_options() {
    for args in [
        vec!["bench", "--reps", "0"],
        vec!["bench", "--size", "12Q"],
        vec!["bench", "--gpus", "7", "--no-cuda"],
    ] {
        let o = Command::new(env!("CARGO_BIN_EXE_numapin"))
            .args(&args)
            .env("NUMAPIN_NO_CUDA", "1")
            .output()
            .unwrap();
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }
}
