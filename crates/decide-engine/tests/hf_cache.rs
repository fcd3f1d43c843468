//! Resolution through the Hugging Face cache, offline: a model that `decide models pull` (or
//! any Hugging Face tool) put in `$HF_HOME/hub` is found by its id without a download.
//! Its own test binary, because it points `HF_HOME` at a folder of its own.

mod common;

use decide_engine::{resolve, Engine};

#[test]
fn a_model_in_the_hugging_face_cache_is_found_by_its_id() {
    let home = std::env::temp_dir().join(format!("decide-hf-home-{}", std::process::id()));
    let repo = home.join("hub").join("models--acme--tiny-reranker");
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let snapshot = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snapshot).unwrap();
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs").join("main"), commit).unwrap();
    for f in ["config.json", "tokenizer.json", "model.safetensors"] {
        std::fs::copy(
            common::fixtures().join("tiny-bert-1").join(f),
            snapshot.join(f),
        )
        .unwrap();
    }
    std::env::set_var("HF_HOME", &home);

    let location = resolve("acme/tiny-reranker").unwrap();
    assert_eq!(location.dir, snapshot.canonicalize().unwrap());
    let engine = Engine::builder()
        .model("acme/tiny-reranker")
        .build()
        .unwrap();
    assert_eq!(engine.info().name, "acme/tiny-reranker");

    let err = resolve("acme/not-there").unwrap_err().to_string();
    assert!(err.contains("the Hugging Face cache"), "{err}");
    assert!(err.contains("decide models pull acme/not-there"), "{err}");
    std::fs::remove_dir_all(&home).unwrap();
}
