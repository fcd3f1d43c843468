//! The engine against reference outputs of PyTorch / sentence-transformers, written by
//! `fixtures/make_fixtures.py`: real all-MiniLM-L6-v2 embeddings and tiny random-weight BERT and
//! XLM-RoBERTa sequence classifiers.

mod common;

use std::collections::HashMap;

use candle_core::{Device, Tensor};
use common::{devices, fixtures, tolerance};
use decide_engine::{Engine, HeadName, ScoreKind};
use serde_json::Value;

fn reference(dir: &str) -> Value {
    let text = std::fs::read_to_string(fixtures().join(dir).join("reference.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn pairs(r: &Value) -> Vec<(String, String)> {
    r["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_string(),
                p[1].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

fn check_classifier(dir: &str) {
    let r = reference(dir);
    let pairs = pairs(&r);
    let refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let expected: Vec<Vec<f64>> = serde_json::from_value(r["logits"].clone()).unwrap();
    let expected_ids: Vec<Vec<u32>> = serde_json::from_value(r["input_ids"].clone()).unwrap();
    for device in devices() {
        let engine = Engine::builder()
            .model(fixtures().join(dir).to_str().unwrap())
            .device(device)
            .build()
            .unwrap();
        assert_eq!(engine.info().head, HeadName::CrossEncoder);
        for ((q, d), ids) in refs.iter().zip(&expected_ids) {
            assert_eq!(
                &engine.pair_token_ids(q, d).unwrap(),
                ids,
                "{dir}: token ids of ({q}, {d})"
            );
        }
        let logits = engine.classify_pairs(&refs).unwrap();
        assert_eq!(logits.len(), expected.len());
        let mut spread = 0f64;
        for (got, want) in logits.iter().zip(&expected) {
            assert_eq!(got.len(), want.len());
            for (g, w) in got.iter().zip(want) {
                assert!(
                    (*g as f64 - w).abs() < tolerance(device) as f64,
                    "{dir} on {device}: logit {g} vs reference {w}"
                );
            }
            spread = spread.max((want[0] - expected[0][0]).abs());
        }
        // Reference logits that were all equal would let a broken model pass.
        assert!(
            spread > 0.05,
            "{dir}: reference logits do not differ between pairs"
        );
    }
}

#[test]
fn tiny_bert_one_label_matches_pytorch() {
    check_classifier("tiny-bert-1");
}

#[test]
fn tiny_bert_nli_matches_pytorch() {
    check_classifier("tiny-bert-3");
}

#[test]
fn tiny_xlm_roberta_one_label_matches_pytorch() {
    check_classifier("tiny-xlmr-1");
}

#[test]
fn tiny_xlm_roberta_nli_matches_pytorch() {
    check_classifier("tiny-xlmr-3");
}

#[test]
fn nli_scores_are_entailment_log_odds() {
    let r = reference("tiny-bert-3");
    let pairs = pairs(&r);
    let expected: Vec<Vec<f64>> = serde_json::from_value(r["logits"].clone()).unwrap();
    let engine = Engine::builder()
        .model(fixtures().join("tiny-bert-3").to_str().unwrap())
        .build()
        .unwrap();
    assert_eq!(engine.info().score_kind, ScoreKind::Entailment);
    let (q, d) = &pairs[0];
    let s = engine.score(q, &[d.as_str()]).unwrap().raw[0];
    let l = &expected[0];
    let p_entail = l[1].exp() / l.iter().map(|x| x.exp()).sum::<f64>();
    let p = decide_engine::sigmoid(s);
    assert!(
        (p - p_entail).abs() < 1e-4,
        "{p} vs softmax entailment {p_entail}"
    );
}

#[test]
fn weights_without_the_encoder_prefix_load_the_same() {
    let src = fixtures().join("tiny-bert-1");
    let dir = std::env::temp_dir().join(format!("decide-noprefix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let tensors =
        candle_core::safetensors::load(src.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(tensors.keys().any(|k| k.starts_with("bert.")));
    let stripped: HashMap<String, Tensor> = tensors
        .into_iter()
        .map(|(k, v)| (k.strip_prefix("bert.").map(str::to_string).unwrap_or(k), v))
        .collect();
    candle_core::safetensors::save(&stripped, dir.join("model.safetensors")).unwrap();

    let r = reference("tiny-bert-1");
    let pairs = pairs(&r);
    let refs: Vec<(&str, &str)> = pairs
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let expected: Vec<Vec<f64>> = serde_json::from_value(r["logits"].clone()).unwrap();
    let engine = Engine::builder()
        .model(dir.to_str().unwrap())
        .build()
        .unwrap();
    let logits = engine.classify_pairs(&refs).unwrap();
    for (got, want) in logits.iter().zip(&expected) {
        assert!((got[0] as f64 - want[0]).abs() < 1e-4);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn minilm_embeddings_match_sentence_transformers() {
    let text = std::fs::read_to_string(fixtures().join("minilm-embeddings.json")).unwrap();
    let r: Value = serde_json::from_str(&text).unwrap();
    let texts: Vec<String> = serde_json::from_value(r["texts"].clone()).unwrap();
    let expected: Vec<Vec<f64>> = serde_json::from_value(r["embeddings"].clone()).unwrap();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    for device in devices() {
        let engine = Engine::builder()
            .model(decide_engine::BASE_MODEL)
            .device(device)
            .build()
            .unwrap();
        let got = engine.embed(&refs).unwrap();
        for (i, (g, w)) in got.iter().zip(&expected).enumerate() {
            assert_eq!(g.len(), w.len());
            let dot: f64 = g.iter().zip(w).map(|(a, b)| *a as f64 * b).sum();
            let max_diff = g
                .iter()
                .zip(w)
                .map(|(a, b)| (*a as f64 - b).abs())
                .fold(0.0, f64::max);
            assert!(dot > 0.9999, "text {i} on {device}: cosine {dot}");
            assert!(
                max_diff < tolerance(device) as f64,
                "text {i} on {device}: max diff {max_diff}"
            );
        }
    }
}

#[test]
fn legacy_pytorch_weights_load_when_there_is_no_safetensors() {
    assert!(!fixtures()
        .join("tiny-bert-1-pth/model.safetensors")
        .exists());
    check_classifier("tiny-bert-1-pth");
}
