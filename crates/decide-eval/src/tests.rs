//! Every metric on a tiny example computed by hand, and the edge cases where a metric has nothing to average.

use std::collections::HashSet;

use crate::{
    evaluate, evaluate_with, ranking, split_by_seen, Candidate, CaseError, EvalError, Rule,
    ScoredCase,
};

fn case(
    expected: &[&str],
    candidates: &[(&str, f64)],
    latency_ms: f64,
    pairs: usize,
) -> ScoredCase {
    ScoredCase::new(
        expected.iter().copied(),
        candidates.iter().map(|&(n, p)| Candidate::new(n, p)),
        latency_ms,
        pairs,
    )
}

#[track_caller]
fn close(actual: f64, expected: f64) {
    assert!(
        (actual - expected).abs() < 1e-12,
        "{actual} is not {expected}"
    );
}

#[track_caller]
fn close_some(actual: Option<f64>, expected: f64) {
    close(actual.expect("a value, not None"), expected);
}

/// Five cases, threshold 0.5.
///
/// * A: needs `b`; ranking a(.9) b(.6) c(.2): `b` is second. Selected: a, b.
/// * B: needs `x`; `x` and `y` tie at .8 and `x` comes first in the catalogue, so it ranks first. Selected: x, y.
/// * C: needs t3, t5, t11 of twelve tools; t0 passed without asking (1.0); the probabilities fall with the index
///   and t8..t11 tie at .05, so the ranking is the catalogue order: the expected tools rank 4, 6 and 12.
///   Selected: t0..t3.
/// * D: needs nothing, nothing reaches .5.
/// * E: needs nothing, `a` sits exactly on the threshold and is selected (inclusive).
fn example() -> Vec<ScoredCase> {
    vec![
        case(&["b"], &[("a", 0.9), ("b", 0.6), ("c", 0.2)], 10.0, 3),
        case(&["x"], &[("x", 0.8), ("y", 0.8), ("z", 0.1)], 20.0, 3),
        case(
            &["t3", "t5", "t11"],
            &[
                ("t0", 1.0),
                ("t1", 0.85),
                ("t2", 0.75),
                ("t3", 0.65),
                ("t4", 0.45),
                ("t5", 0.35),
                ("t6", 0.25),
                ("t7", 0.15),
                ("t8", 0.05),
                ("t9", 0.05),
                ("t10", 0.05),
                ("t11", 0.05),
            ],
            30.0,
            11, // t0 was not scored
        ),
        case(&[], &[("a", 0.1), ("b", 0.3)], 40.0, 2),
        case(&[], &[("a", 0.5), ("b", 0.2)], 100.0, 2),
    ]
}

#[test]
fn every_metric_matches_the_hand_computation() {
    let r = evaluate(&example(), 0.5).unwrap();
    assert_eq!(r.cases, 5);
    assert_eq!(r.single_tool_cases, 2); // A, B
    assert_eq!(r.tool_cases, 3); // A, B, C
    assert_eq!(r.no_tool_cases, 2); // D, E
    assert_eq!(r.pairs, 21); // 3 + 3 + 11 + 2 + 2
    close(r.threshold, 0.5);

    // Top-1 over A and B: A ranks `a` first (miss), B ranks `x` first by the tie rule (hit) → 1/2.
    close_some(r.top1_accuracy, 0.5);

    // Recall@k over A, B, C, with C's expected tools at ranks 4, 6, 12:
    // @1:  A 0, B 1, C 0/3           → 1/3
    // @3:  A 1, B 1, C 0/3           → 2/3
    // @5:  A 1, B 1, C 1/3 (t3)      → (2 + 1/3)/3 = 7/9
    // @10: A 1, B 1, C 2/3 (t3, t5)  → (2 + 2/3)/3 = 8/9
    close_some(r.recall_at_1, 1.0 / 3.0);
    close_some(r.recall_at_3, 2.0 / 3.0);
    close_some(r.recall_at_5, 7.0 / 9.0);
    close_some(r.recall_at_10, 8.0 / 9.0);

    // MRR: A 1/2, B 1/1, C 1/4 → (0.5 + 1 + 0.25)/3 = 7/12.
    close_some(r.mrr, 7.0 / 12.0);

    // Selected at 0.5: A {a, b}, B {x, y}, C {t0, t1, t2, t3}, D {}, E {a}.
    // TP: A b, B x, C t3                       = 3
    // FP: A a, B y, C t0 t1 t2, E a            = 6
    // FN: C t5 t11                             = 2
    // precision 3/(3+6) = 1/3, recall 3/(3+2) = 3/5.
    close_some(r.precision, 1.0 / 3.0);
    close_some(r.recall, 0.6);
    // Every needed tool selected: A and B, not C (t5 and t11 missed) → 2/3.
    close_some(r.all_needed_selected, 2.0 / 3.0);

    // No-tool cases: D selects nothing, E selects `a` → 1/2.
    close_some(r.no_tool_none_selected, 0.5);

    // Selected per case: A 2, B 2, C 4, D 0, E 1 → 9/5.
    close(r.mean_selected, 1.8);

    // ECE over the 22 pairs, per bin |Σp − Σlabel|:
    // bin 0 [0, .1):  C .05 .05 .05 .05(t11, label 1)   |0.20 − 1| = 0.80
    // bin 1 [.1, .2): B .1, C .15, D .1                 |0.35 − 0| = 0.35
    // bin 2 [.2, .3): A .2, C .25, E .2                 |0.65 − 0| = 0.65
    // bin 3 [.3, .4): C .35(1), D .3                    |0.65 − 1| = 0.35
    // bin 4 [.4, .5): C .45                             |0.45 − 0| = 0.45
    // bin 5 [.5, .6): E .5                              |0.50 − 0| = 0.50
    // bin 6 [.6, .7): A .6(1), C .65(1)                 |1.25 − 2| = 0.75
    // bin 7 [.7, .8): C .75                             |0.75 − 0| = 0.75
    // bin 8 [.8, .9): B .8(1), B .8, C .85              |2.45 − 1| = 1.45
    // bin 9 [.9, 1]:  A .9, C 1.0                       |1.90 − 0| = 1.90
    // pairs per bin 4+3+3+2+1+1+2+1+3+2 = 22; sum 7.95 → ECE = 7.95/22.
    close(r.ece, 7.95 / 22.0);

    // Latencies sorted: 10 20 30 40 100. p50: rank ⌈50·5/100⌉ = 3 → 30; p95: rank ⌈95·5/100⌉ = 5 → 100.
    close(r.latency_p50_ms, 30.0);
    close(r.latency_p95_ms, 100.0);

    // 21 pairs in 200 ms = 0.2 s → 105 pairs per second.
    close_some(r.pairs_per_second, 105.0);
}

#[test]
fn ties_rank_by_catalogue_order() {
    let candidates = [
        Candidate::new("a", 0.2),
        Candidate::new("b", 0.7),
        Candidate::new("c", 0.2),
        Candidate::new("d", 0.7),
        Candidate::new("e", 1.0),
    ];
    assert_eq!(ranking(&candidates), [4, 1, 3, 0, 2]);
    // The expected tool `d` ties with the earlier `b`, so it ranks third, not second: RR = 1/3, top-1 misses.
    let r = evaluate(&[ScoredCase::new(["d"], candidates, 1.0, 4)], 0.5).unwrap();
    close_some(r.mrr, 1.0 / 3.0);
    close_some(r.top1_accuracy, 0.0);
    close_some(r.recall_at_3, 1.0);
    close_some(r.recall_at_1, 0.0);
}

#[test]
fn the_same_input_gives_the_same_report() {
    assert_eq!(
        evaluate(&example(), 0.5).unwrap(),
        evaluate(&example(), 0.5).unwrap()
    );
}

#[test]
fn without_single_tool_cases_top1_is_none_not_nan() {
    let r = evaluate(
        &[
            case(&["a", "b"], &[("a", 0.9), ("b", 0.4), ("c", 0.1)], 5.0, 3),
            case(&[], &[("a", 0.1)], 5.0, 1),
        ],
        0.5,
    )
    .unwrap();
    assert_eq!(r.single_tool_cases, 0);
    assert_eq!(r.top1_accuracy, None);
    // The two-tool case still has recall@k and MRR: @1 = 1/2 (a), MRR = 1.
    close_some(r.recall_at_1, 0.5);
    close_some(r.mrr, 1.0);
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["top1_accuracy"].is_null(), "{json}");
}

#[test]
fn without_no_tool_cases_the_share_is_none() {
    let r = evaluate(&[case(&["a"], &[("a", 0.9), ("b", 0.1)], 5.0, 2)], 0.5).unwrap();
    assert_eq!(r.no_tool_cases, 0);
    assert_eq!(r.no_tool_none_selected, None);
    close_some(r.top1_accuracy, 1.0);
}

#[test]
fn only_no_tool_cases_leave_the_tool_metrics_none() {
    // Nothing expected and nothing selected: no denominator for recall@k, MRR, precision or recall.
    let r = evaluate(&[case(&[], &[("a", 0.1), ("b", 0.2)], 5.0, 2)], 0.5).unwrap();
    assert_eq!(r.tool_cases, 0);
    for metric in [
        r.top1_accuracy,
        r.recall_at_1,
        r.recall_at_3,
        r.recall_at_5,
        r.recall_at_10,
        r.mrr,
        r.precision,
        r.recall,
        r.all_needed_selected,
    ] {
        assert_eq!(metric, None, "{r:?}");
    }
    close_some(r.no_tool_none_selected, 1.0);
    // |0.1 + 0.2 − 0| / 2 = 0.15 (bins 1 and 2, one pair each).
    close(r.ece, 0.15);
}

#[test]
fn empty_input_is_an_error() {
    assert_eq!(evaluate(&[], 0.5), Err(EvalError::NoCases));
}

#[test]
fn zero_latency_leaves_pairs_per_second_none() {
    let r = evaluate(&[case(&["a"], &[("a", 0.9)], 0.0, 1)], 0.5).unwrap();
    assert_eq!(r.pairs_per_second, None);
    close(r.latency_p50_ms, 0.0);
}

#[test]
fn probabilities_one_and_zero_fall_in_the_outer_bins() {
    // 1.0 goes to bin 9 with .95, 0.0 to bin 0 with .05:
    // bin 0: |0 + .05 − 1| = .95 (the 0.0 pair is expected); bin 9: |1 + .95 − 2| = .05 → (0.95 + 0.05)/4 = 0.25.
    let r = evaluate(
        &[case(
            &["one", "zero", "high"],
            &[("one", 1.0), ("zero", 0.0), ("high", 0.95), ("low", 0.05)],
            1.0,
            4,
        )],
        0.5,
    )
    .unwrap();
    close(r.ece, 0.25);
}

#[test]
fn percentiles_use_integer_nearest_rank() {
    // 20 latencies 1..=20 ms: p50 rank ⌈50·20/100⌉ = 10, p95 rank ⌈95·20/100⌉ = 19 (not 20, as 0.95·20 in
    // floating point could give).
    let cases: Vec<ScoredCase> = (1..=20)
        .map(|ms| case(&["a"], &[("a", 0.9)], f64::from(ms), 1))
        .collect();
    let r = evaluate(&cases, 0.5).unwrap();
    close(r.latency_p50_ms, 10.0);
    close(r.latency_p95_ms, 19.0);
    // One case: both percentiles are its latency.
    let r = evaluate(&cases[4..5], 0.5).unwrap();
    close(r.latency_p50_ms, 5.0);
    close(r.latency_p95_ms, 5.0);
}

#[test]
fn recall_at_k_takes_the_whole_catalogue_when_it_is_shorter_than_k() {
    // Two tools, both expected, `b` ranks second: @1 = 1/2, @3 = @5 = @10 = 2/2.
    let r = evaluate(&[case(&["a", "b"], &[("a", 0.9), ("b", 0.1)], 1.0, 2)], 0.5).unwrap();
    close_some(r.recall_at_1, 0.5);
    close_some(r.recall_at_3, 1.0);
    close_some(r.recall_at_10, 1.0);
}

#[test]
fn the_threshold_moves_the_selected_set() {
    // At 0.0 every tool is selected: TP 5 (all expected: 1 + 1 + 3), FP 17 (22 pairs − 5), FN 0; D and E both
    // select something.
    let r = evaluate(&example(), 0.0).unwrap();
    close_some(r.precision, 5.0 / 22.0);
    close_some(r.recall, 1.0);
    close_some(r.all_needed_selected, 1.0);
    close_some(r.no_tool_none_selected, 0.0);
    close(r.mean_selected, 22.0 / 5.0);
    // At 1.0 only C's t0 (passed without asking) is selected: TP 0, FP 1, FN 5.
    let r = evaluate(&example(), 1.0).unwrap();
    close_some(r.precision, 0.0);
    close_some(r.recall, 0.0);
    close_some(r.all_needed_selected, 0.0);
    close_some(r.no_tool_none_selected, 1.0);
    // The ranking metrics do not depend on the threshold.
    close_some(r.mrr, 7.0 / 12.0);
}

#[test]
fn bad_cases_and_thresholds_are_refused() {
    assert_eq!(
        evaluate(&example(), 1.5),
        Err(EvalError::InvalidThreshold(1.5))
    );
    assert!(matches!(
        evaluate(&example(), f64::NAN),
        Err(EvalError::InvalidThreshold(_))
    ));
    let bad = [
        (case(&["a"], &[], 1.0, 0), CaseError::NoCandidates),
        (
            case(&["a"], &[("a", 0.5), ("a", 0.4)], 1.0, 2),
            CaseError::DuplicateCandidate("a".into()),
        ),
        (
            case(&["a"], &[("a", 1.2)], 1.0, 1),
            CaseError::InvalidProbability {
                tool: "a".into(),
                probability: 1.2,
            },
        ),
        (
            case(&["b"], &[("a", 0.5)], 1.0, 1),
            CaseError::UnknownExpected("b".into()),
        ),
        (
            case(&["a", "a"], &[("a", 0.5)], 1.0, 1),
            CaseError::DuplicateExpected("a".into()),
        ),
        (
            case(&["a"], &[("a", 0.5)], -1.0, 1),
            CaseError::InvalidLatency(-1.0),
        ),
    ];
    for (bad, error) in bad {
        assert_eq!(bad.check(), Err(error.clone()));
        let cases = vec![example()[0].clone(), bad];
        assert_eq!(
            evaluate(&cases, 0.5),
            Err(EvalError::Case { index: 1, error })
        );
    }
    let nan = case(&["a"], &[("a", f64::NAN)], 1.0, 1);
    assert!(matches!(
        nan.check(),
        Err(CaseError::InvalidProbability { .. })
    ));
    assert!(matches!(
        case(&["a"], &[("a", 0.5)], f64::INFINITY, 1).check(),
        Err(CaseError::InvalidLatency(_))
    ));
    assert_eq!(
        EvalError::Case {
            index: 1,
            error: CaseError::UnknownExpected("b".into())
        }
        .to_string(),
        "case 1: expected tool \"b\" is not a candidate"
    );
}

#[test]
fn the_report_serializes_every_metric() {
    let json = serde_json::to_value(evaluate(&example(), 0.5).unwrap()).unwrap();
    for key in [
        "cases",
        "single_tool_cases",
        "tool_cases",
        "no_tool_cases",
        "pairs",
        "threshold",
        "top1_accuracy",
        "recall_at_1",
        "recall_at_3",
        "recall_at_5",
        "recall_at_10",
        "mrr",
        "precision",
        "recall",
        "all_needed_selected",
        "no_tool_none_selected",
        "mean_selected",
        "ece",
        "latency_p50_ms",
        "latency_p95_ms",
        "pairs_per_second",
    ] {
        assert!(json.get(key).is_some(), "{key} missing in {json}");
    }
}

#[test]
fn reliability_bins_by_hand() {
    // Bin 0: 0.05 (no), 0.0 (no) → mean 0.025, rate 0. Bin 5: 0.5 (yes), 0.55 (no) → mean 0.525,
    // rate 0.5. Bin 9: 1.0 (yes) → mean 1, rate 1.
    let r = crate::Reliability::new([
        (0.05, false),
        (0.0, false),
        (0.5, true),
        (0.55, false),
        (1.0, true),
    ]);
    assert_eq!(r.bins.len(), crate::CALIBRATION_BINS);
    assert_eq!(r.bins[0].count, 2);
    assert!((r.bins[0].mean_probability - 0.025).abs() < 1e-12);
    assert_eq!(r.bins[0].positive_rate, 0.0);
    assert_eq!(r.bins[5].count, 2);
    assert!((r.bins[5].mean_probability - 0.525).abs() < 1e-12);
    assert_eq!(r.bins[5].positive_rate, 0.5);
    assert_eq!(r.bins[9].count, 1);
    assert_eq!(r.bins.iter().map(|b| b.count).sum::<usize>(), 5);
    // ECE = (2·0.025 + 2·0.025 + 0) / 5 = 0.02.
    assert!((r.ece - 0.02).abs() < 1e-12, "{}", r.ece);
    assert_eq!(crate::Reliability::new([]).ece, 0.0);
}

fn names(names: &[&str]) -> HashSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

#[test]
fn seen_and_unseen_tools_by_hand() {
    // The example's needed tools rank: A b 2, B x 1, C t3 4, t5 6, t11 12. Seen in training: b, t3, t11 (and `q`,
    // which no case needs).
    let split = split_by_seen(&example(), &names(&["b", "t3", "t11", "q"])).unwrap();
    // Seen: ranks 2, 4, 12 → @5 2/3, @10 2/3, MRR (1/2 + 1/4 + 1/12)/3 = 5/18.
    assert_eq!(split.seen.needed, 3);
    close_some(split.seen.recall_at_5, 2.0 / 3.0);
    close_some(split.seen.recall_at_10, 2.0 / 3.0);
    close_some(split.seen.mrr, 5.0 / 18.0);
    // Unseen: ranks 1, 6 → @5 1/2, @10 1, MRR (1 + 1/6)/2 = 7/12.
    assert_eq!(split.unseen.needed, 2);
    close_some(split.unseen.recall_at_5, 0.5);
    close_some(split.unseen.recall_at_10, 1.0);
    close_some(split.unseen.mrr, 7.0 / 12.0);
}

#[test]
fn an_empty_group_is_none_and_the_groups_add_up() {
    let split = split_by_seen(&example(), &HashSet::new()).unwrap();
    assert_eq!(split.seen.needed, 0);
    assert_eq!(split.seen.recall_at_5, None);
    assert_eq!(split.seen.recall_at_10, None);
    assert_eq!(split.seen.mrr, None);
    // Every needed pair is unseen: ranks 2, 1, 4, 6, 12 → @5 3/5, @10 4/5.
    assert_eq!(split.unseen.needed, 5);
    close_some(split.unseen.recall_at_5, 0.6);
    close_some(split.unseen.recall_at_10, 0.8);
    let json = serde_json::to_value(&split).unwrap();
    assert!(json["seen"]["recall_at_5"].is_null(), "{json}");
    assert_eq!(json["unseen"]["needed"], 5, "{json}");
    // No cases: two empty groups, not an error.
    let none = split_by_seen(&[], &names(&["b"])).unwrap();
    assert_eq!((none.seen.needed, none.unseen.needed), (0, 0));
    // A bad case is refused as `evaluate` refuses it.
    let bad = [case(&["nope"], &[("a", 0.5)], 1.0, 1)];
    assert_eq!(
        split_by_seen(&bad, &names(&["a"])),
        Err(EvalError::Case {
            index: 0,
            error: CaseError::UnknownExpected("nope".into())
        })
    );
}

#[test]
fn a_scored_tool_passed_without_asking_ranks_by_its_probability_and_counts_only_as_passed() {
    // A no-tool case after a call of t0, which the model finds unlikely (0.1): t1 ranks first, the
    // model selected nothing at 0.5, and the filter still passes t0.
    let no_tool = ScoredCase::new(
        Vec::<String>::new(),
        [Candidate::passed("t0", 0.1), Candidate::new("t1", 0.3)],
        1.0,
        2,
    );
    let needs_t1 = ScoredCase::new(
        ["t1"],
        [Candidate::passed("t0", 0.2), Candidate::new("t1", 0.6)],
        1.0,
        2,
    );
    let r = evaluate(&[no_tool, needs_t1], 0.5).unwrap();
    close_some(r.top1_accuracy, 1.0);
    close_some(r.no_tool_none_selected, 1.0);
    close_some(r.precision, 1.0);
    close_some(r.recall, 1.0);
    // Selected: t0 in both (passed), t1 in the second.
    close(r.mean_selected, 1.5);
}

/// The needs-tool gate at 0.5 with companions from 0.2, by hand: case 1's best tool (0.6) opens it, and b (0.3)
/// passes with it; case 2's best (0.4) alone does not, but a head answer of 0.8 does (logit 1.386 − 0.405 = 0.981,
/// probability 0.727), and with it c (0.25); case 3 needs nothing and its best (0.3) keeps it shut; case 4's best
/// is passed without asking, so the gate reads the best asked tool (0.1) and stays shut.
#[test]
fn the_gate_selects_by_hand() {
    let cases = vec![
        case(&["a", "b"], &[("a", 0.6), ("b", 0.3), ("c", 0.1)], 1.0, 3),
        case(&["a", "c"], &[("a", 0.4), ("b", 0.1), ("c", 0.25)], 1.0, 3)
            .with_needs_tool(Some(0.8)),
        case(&[], &[("a", 0.3), ("b", 0.25)], 1.0, 2),
        ScoredCase::new(
            ["a"],
            [Candidate::passed("a", 0.9), Candidate::new("b", 0.1)],
            1.0,
            2,
        ),
    ];
    let rule = Rule::Gate {
        min_probability: 0.5,
        companion_min_probability: 0.2,
    };
    let r = evaluate_with(&cases, rule).unwrap();
    assert_eq!(r.threshold, 0.5);
    assert_eq!(r.companion_min_probability, Some(0.2));
    // Needed: a, b, a, c, a; selected of them: a, b (case 1), a, c (case 2); case 4's a is passed without asking
    // but the shut gate does not select it.
    close_some(r.recall, 4.0 / 5.0);
    close_some(r.precision, 1.0);
    close_some(r.no_tool_none_selected, 1.0);
    // Selected per case: 2, 2, 0, and case 4's tool passed without asking.
    close(r.mean_selected, 5.0 / 4.0);
    // At one threshold of 0.5, only case 1's a and case 4's a.
    let plain = evaluate(&cases, 0.5).unwrap();
    close_some(plain.recall, 2.0 / 5.0);
    assert_eq!(plain.companion_min_probability, None);
    // The companion threshold is checked like the threshold.
    let bad = Rule::Gate {
        min_probability: 0.5,
        companion_min_probability: 1.5,
    };
    assert_eq!(
        evaluate_with(&cases, bad),
        Err(EvalError::InvalidThreshold(1.5))
    );
}
