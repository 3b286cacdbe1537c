//! `numapin bench`: measure how fast data reaches each GPU.

use std::io::IsTerminal;

use crate::source::TopoSource;
use numapin::text::Table;
mod figures;
mod pinning;
mod report;

use crate::error::{CliError, Result};
use crate::output;
use figures::{self as bench, BenchOptions, Measure};
use numapin::runtime::{HugePages, Runtime, RuntimeConfig};
use numapin::topology::limits::MAX_GPUS;

/// Arguments of `numapin bench`.
#[derive(Debug, clap::Args)]
pub(crate) struct BenchArgs {
    /// Where the description comes from (`--input` is refused: a benchmark
    /// measures this machine).
    #[command(flatten)]
    pub(crate) source: TopoSource,
    /// CUDA ordinals to measure, comma-separated, each 0-1023 (default:
    /// every visible GPU).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(0..MAX_GPUS as i64))]
    pub(crate) gpus: Option<Vec<u32>>,
    /// Bytes per copy, 1 byte to 1 TiB (suffixes K, M, G: powers of 1024).
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub(crate) size: usize,
    /// Timed repetitions per figure, 1-100.
    #[arg(long, default_value_t = 10, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=MAX_REPS))]
    pub(crate) reps: usize,
    /// Untimed repetitions before them, 0-100.
    #[arg(long, default_value_t = 2, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(0..=MAX_REPS))]
    pub(crate) warmup: usize,
    /// Measurements to run (default: all).
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Option<Vec<Measure>>,
    /// Region sizes for the pinning figures, comma-separated (suffixes K,
    /// M, G; each rounded up to 2 MiB).
    #[arg(long, value_delimiter = ',', default_value = "256M,4G", value_parser = parse_size)]
    pub(crate) region_sizes: Vec<usize>,
    /// Pinned bytes allowed per node (suffixes K, M, G), instead of the
    /// default budget (half the node's memory, capped by a memory cgroup).
    #[arg(long, value_parser = parse_size)]
    pub(crate) budget: Option<usize>,
    /// With the staged figures: sweep the staged copy's threads (4, 8, 12,
    /// 16, at most the GPU's CPUs) and chunk sizes (1-8 MiB) at 256 MiB
    /// and 1 GiB, beside the pinned rate of each size.
    #[arg(long)]
    pub(crate) staged_sweep: bool,
    /// Print JSON (schema in docs/bench.md).
    #[arg(long)]
    pub(crate) json: bool,
    /// Pages of the arena's regions: `auto` (hugetlb pages when the node's
    /// pool has enough free, else transparent huge pages), `thp`, `2m` or
    /// `1g` (hugetlb pages from the node's pool; too few is an error), or
    /// `none` (4 KiB pages).
    #[arg(long, default_value = "auto", value_parser = parse_huge_pages)]
    pub(crate) huge_pages: HugePages,
}

/// Parses `auto`, `thp`, `2m`, `1g`, `none`.
fn parse_huge_pages(s: &str) -> Result<HugePages, String> {
    s.parse()
        .map_err(|e: numapin::runtime::ParseHugePagesError| e.to_string())
}

/// Most timed (or warm-up) repetitions per figure: the host figures keep
/// 20,000 samples per repetition.
const MAX_REPS: u64 = 100;

/// Parses `256M`, `1G`, `4096`.
pub(crate) fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1usize << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let n: usize = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size (examples: 4096, 64M, 1G)"))?;
    n.checked_mul(mult)
        .filter(|v| *v > 0 && *v <= 1 << 40)
        .ok_or_else(|| format!("`{s}` is out of range (1 byte to 1 TiB)"))
}

pub(crate) fn run(a: &BenchArgs) -> Result<i32> {
    if a.source.input.is_some() {
        return Err(CliError::Usage {
            problem: "bench measures this machine and cannot read --input".into(),
            fix: "drop --input".into(),
        });
    }
    let topo = a.source.topology()?;
    let mut config = RuntimeConfig::default().with_huge_pages(a.huge_pages);
    if let Some(b) = a.budget {
        config = config.with_budget_bytes(Some(b as u64));
    }
    let rt = Runtime::new(topo, config)?;
    let opts = BenchOptions {
        gpus: a
            .gpus
            .as_ref()
            .map(|v| v.iter().copied().map(numapin::CudaOrdinal).collect()),
        copy_bytes: a.size,
        reps: a.reps,
        warmup: a.warmup,
        measures: a
            .only
            .clone()
            .unwrap_or_else(|| BenchOptions::default().measures),
        region_sizes: a.region_sizes.clone(),
        staged_sweep: a.staged_sweep,
    };
    if a.gpus.as_ref().is_some_and(|g| g.len() > MAX_GPUS) {
        return Err(CliError::Usage {
            problem: format!("--gpus lists more than {MAX_GPUS} GPUs"),
            fix: "list each GPU once".into(),
        });
    }
    let tty = std::io::stderr().is_terminal();
    let mut progress = |what: &str| {
        if tty {
            output::progress(&format!("\r\x1b[2Kbench: {what}..."));
        }
    };
    // Figures measured before a failure (pinned memory refused by the
    // memlock limit) are printed, then the failure.
    let (report, failure) = bench::run(&rt, &opts, &mut progress)?;
    if tty {
        output::progress("\r\x1b[2K");
    }
    print_report(&report, a.json)?;
    match failure {
        Some(e) => Err(e),
        None => Ok(0),
    }
}

fn print_report(report: &figures::BenchReport, json: bool) -> Result<()> {
    if json {
        return output::println(
            &serde_json::to_string_pretty(&report).expect("the report serializes"),
        );
    }
    let m = &report.machine;
    output::println(&format!(
        "{} ({}, {} CPUs, {} NUMA node(s), {})\n",
        m.hostname,
        m.cpu,
        m.cpus,
        m.numa_nodes,
        m.cuda_driver
            .map_or("no CUDA driver".to_string(), |v| format!(
                "CUDA driver {}.{}",
                v / 1000,
                (v % 1000) / 10
            ))
    ))?;
    let mut t = Table::new([
        "FIGURE",
        "PARAMETERS",
        "MEDIAN",
        "MIN",
        "MAX",
        "UNIT",
        "REPS",
    ]);
    for r in &report.results {
        let params: Vec<String> = r
            .params
            .iter()
            .map(|(k, v)| format!("{k}={}", v.to_string().trim_matches('"')))
            .collect();
        let f = |v: f64| {
            if v >= 100.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.2}")
            }
        };
        t.row([
            r.name.clone(),
            params.join(" "),
            f(r.median),
            f(r.min),
            f(r.max),
            r.unit.clone(),
            r.reps.to_string(),
        ]);
    }
    let mut text = t.render();
    let ratios = bench::ratios(&report.results);
    if !ratios.is_empty() {
        text.push_str("\nRatios (medians):\n");
        for (what, v) in ratios {
            text.push_str(&format!("  {what}: {v:.2}x\n"));
        }
    }
    for n in &report.notes {
        text.push_str(&format!("\nNote: {n}\n"));
    }
    output::print(&text)
}

#[cfg(test)]
mod tests {
    use super::{parse_huge_pages, parse_size};
    use numapin::runtime::HugePages;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1g").unwrap(), 1 << 30);
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999G").is_err());
    }

    #[test]
    fn huge_page_choices() {
        assert_eq!(parse_huge_pages("2m"), Ok(HugePages::Hugetlb2M));
        assert_eq!(parse_huge_pages("thp"), Ok(HugePages::Transparent));
        let e = parse_huge_pages("4k").unwrap_err();
        assert!(e.contains("auto, thp, 2m, 1g or none"), "{e}");
    }
}
