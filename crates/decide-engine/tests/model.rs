//! The engine with the real default model (sentence-transformers/all-MiniLM-L6-v2, fetched by
//! `models/fetch`): batching, trimming, caching and decisions.

mod common;

use std::sync::OnceLock;

use common::{fixtures, relative_close};
use decide_contract::{
    ChoiceQuestion, DecisionInput, DecisionModel, DecisionRequest, ScaleQuestion, YesNoQuestion,
};
use decide_engine::{candidate_text, Engine, EngineError, Scorer};

/// One model for the whole test binary: loading it is the slow part.
fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::builder().build().expect("run models/fetch first"))
}

const TOOLS: &[(&str, &str)] = &[
    ("get_forecast", "Get the weather forecast for a location"),
    (
        "send_email",
        "Send an email to a recipient with a subject and body",
    ),
    (
        "create_event",
        "Create a new event in the user's Google Calendar",
    ),
    (
        "read_file",
        "Read the complete contents of a file from the file system",
    ),
    ("search_repositories", "Search for GitHub repositories"),
    (
        "slack_post_message",
        "Post a new message to a Slack channel",
    ),
];

fn tool_texts() -> Vec<String> {
    TOOLS.iter().map(|(n, d)| candidate_text(n, d)).collect()
}

fn words(n: usize, word: &str) -> String {
    vec![word; n].join(" ")
}

#[test]
fn batched_scores_equal_one_by_one_scores() {
    // A cache-less engine so the batched run really embeds every candidate again, and a small
    // token budget so the candidates span several batches of different lengths.
    let fresh = Engine::builder()
        .cache_capacity(0)
        .max_batch_tokens(96)
        .build()
        .unwrap();
    let mut candidates = tool_texts();
    candidates.push(words(40, "calendar"));
    candidates.push("x".into());
    let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
    let query = "user: what will the weather be like in Paris tomorrow?";
    let batched = fresh.score(query, &refs).unwrap().raw;
    for (i, c) in refs.iter().enumerate() {
        let single = fresh.score(query, &[c]).unwrap().raw[0];
        assert!(
            relative_close(batched[i], single, 1e-5),
            "{c}: batched {} vs single {single}",
            batched[i]
        );
    }
}

#[test]
fn a_forward_pass_cut_into_cache_sized_chunks_equals_the_single_rows() {
    // 150 rows are more than the CPU path's pass of 1,024 tokens, so they run packed into
    // several passes (and padded into batches on the stock path); each row must come out as
    // it does alone.
    for model in ["all-MiniLM-L6-v2", "tiny-xlmr-1"] {
        let spec = if model == "tiny-xlmr-1" {
            fixtures().join(model).to_str().unwrap().to_string()
        } else {
            model.to_string()
        };
        let engine = Engine::builder()
            .model(&spec)
            .cache_capacity(0)
            .max_batch_tokens(1 << 20)
            .build()
            .unwrap();
        let candidates: Vec<String> = (0..150)
            .map(|i| format!("tool {i}: {}", words(i % 13 + 1, "calendar")))
            .collect();
        let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
        let query = "user: put a meeting with Anna in my calendar";
        let batched = engine.score(query, &refs).unwrap().raw;
        for (i, c) in refs.iter().enumerate().step_by(7) {
            let single = engine.score(query, &[c]).unwrap().raw[0];
            assert!(
                relative_close(batched[i], single, 1e-5),
                "{model} {c}: batched {} vs single {single}",
                batched[i]
            );
        }
    }
}

#[test]
fn cross_encoder_batched_equals_single() {
    let engine = Engine::builder()
        .model(fixtures().join("tiny-xlmr-1").to_str().unwrap())
        .max_batch_tokens(64)
        .build()
        .unwrap();
    let candidates: Vec<String> = (1..12).map(|n| words(n * 3, "flight")).collect();
    let refs: Vec<&str> = candidates.iter().map(String::as_str).collect();
    let batched = engine.score("book me a flight to Rome", &refs).unwrap().raw;
    for (i, c) in refs.iter().enumerate() {
        let single = engine.score("book me a flight to Rome", &[c]).unwrap().raw[0];
        assert!(
            relative_close(batched[i], single, 1e-5),
            "{i}: {} vs {single}",
            batched[i]
        );
    }
}

#[test]
fn a_long_conversation_loses_its_oldest_tokens_first() {
    let engine = Engine::builder()
        .model(fixtures().join("tiny-bert-1").to_str().unwrap())
        .max_length(64)
        .build()
        .unwrap();
    let conversation = format!("{} {}", words(100, "old"), words(10, "new"));
    let ids = engine.pair_token_ids(&conversation, "send email").unwrap();
    assert_eq!(ids.len(), 64);
    let text = engine.decode(&ids).unwrap();
    assert!(
        text.ends_with("send email"),
        "the candidate is kept whole: {text}"
    );
    assert_eq!(
        text.matches("new").count(),
        10,
        "the newest words are kept: {text}"
    );
    assert!(text.starts_with("old"), "{text}");
}

#[test]
fn the_candidate_is_cut_only_after_the_conversation() {
    let engine = Engine::builder()
        .model(fixtures().join("tiny-bert-1").to_str().unwrap())
        .max_length(64)
        .build()
        .unwrap();
    // A long candidate and a long conversation: the conversation keeps only its reserved
    // quarter of the budget, the candidate gets the rest.
    let ids = engine
        .pair_token_ids(&words(100, "old"), &words(100, "new"))
        .unwrap();
    assert_eq!(ids.len(), 64);
    let text = engine.decode(&ids).unwrap();
    let budget = 64 - 3;
    assert_eq!(text.matches("old").count(), budget / 4, "{text}");
    assert_eq!(text.matches("new").count(), budget - budget / 4, "{text}");
    // A short conversation is never cut for a long candidate.
    let ids = engine
        .pair_token_ids("old old", &words(100, "new"))
        .unwrap();
    assert_eq!(engine.decode(&ids).unwrap().matches("old").count(), 2);
}

#[test]
fn the_bi_encoder_trims_the_conversation_from_its_oldest_end() {
    let e = engine();
    let tool = ["send_email: Send an email"];
    let request = "user: please send an email to anna";
    let history = words(600, "history");
    let newest_last = e.score(&format!("{history} {request}"), &tool).unwrap().raw[0];
    let newest_first = e.score(&format!("{request} {history}"), &tool).unwrap().raw[0];
    let history_only = e.score(&history, &tool).unwrap().raw[0];
    // The request at the newest end survives the trim and matches the tool; at the oldest end
    // it is cut away, leaving exactly what the history alone gives.
    assert!(
        newest_last > newest_first + 0.03,
        "{newest_last} vs {newest_first}"
    );
    assert!(
        relative_close(newest_first, history_only, 1e-5),
        "{newest_first} vs {history_only}"
    );
}

#[test]
fn repeated_tool_sets_hit_the_embedding_cache() {
    let e = Engine::builder().build().unwrap();
    let texts = tool_texts();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let first = e.score("user: email the report to Anna", &refs).unwrap();
    let second = e
        .score("user: what's the forecast for Berlin?", &refs)
        .unwrap();
    let query_tokens = e
        .count_tokens("user: what's the forecast for Berlin?")
        .unwrap()
        + 2;
    assert_eq!(e.cached_embeddings(), refs.len());
    assert_eq!(
        second.tokens, query_tokens,
        "only the conversation went through the model"
    );
    assert!(first.tokens > second.tokens);
    let again = e.score("user: email the report to Anna", &refs).unwrap();
    for (a, b) in first.raw.iter().zip(&again.raw) {
        assert!(relative_close(*a, *b, 1e-6));
    }
}

fn conversation_input(conversation: &str) -> DecisionInput {
    let mut fields = serde_json::Map::new();
    fields.insert(
        "messages".into(),
        serde_json::json!([{ "role": "user", "text": conversation }]),
    );
    DecisionInput::Fields(fields)
}

fn tool_request(conversation: &str) -> DecisionRequest {
    let mut b = DecisionRequest::builder().input(conversation_input(conversation));
    for (i, (name, description)) in TOOLS.iter().enumerate() {
        b = b.question(
            format!("tool{i}"),
            YesNoQuestion::builder("Would this tool help to handle the request?")
                .candidate(*name, *description)
                .build()
                .unwrap(),
        );
    }
    b.build().unwrap()
}

#[test]
fn the_real_model_selects_the_needed_tool() {
    let cases = [
        ("Will it rain in Paris tomorrow?", "get_forecast"),
        (
            "Send Anna an email saying the meeting moved to 3pm",
            "send_email",
        ),
        (
            "Put a dentist appointment in my calendar for Friday at 10",
            "create_event",
        ),
        ("Show me what's in notes.txt", "read_file"),
    ];
    for (text, needed) in cases {
        let response = engine().decide(&tool_request(text)).unwrap();
        let probs: Vec<f64> = (0..TOOLS.len())
            .map(|i| response.yes_no(&format!("tool{i}")).unwrap().probability())
            .collect();
        let best = probs
            .iter()
            .enumerate()
            .max_by(|a, b| a.1.total_cmp(b.1))
            .unwrap()
            .0;
        assert_eq!(TOOLS[best].0, needed, "{text}: {probs:?}");
        let others_max = probs
            .iter()
            .enumerate()
            .filter(|(i, _)| *i != best)
            .map(|(_, p)| *p)
            .fold(0.0, f64::max);
        assert!(
            others_max < 0.5,
            "{text}: an unneeded tool passes: {probs:?}"
        );
        assert!(response.token_usage().is_some());
    }
}

/// TOOLS with argument names: as the candidates' parameters, or written out in their
/// descriptions the way a model that reads parameters sees them.
fn tool_request_with_arguments(conversation: &str, written_out: bool) -> DecisionRequest {
    const ARGUMENTS: [&[&str]; 6] = [
        &["latitude", "longitude"],
        &["to", "subject", "body"],
        &[],
        &["path"],
        &["query"],
        &["channel_id", "text"],
    ];
    let mut b = DecisionRequest::builder().input(conversation_input(conversation));
    for (i, ((name, description), arguments)) in TOOLS.iter().zip(ARGUMENTS).enumerate() {
        let question = YesNoQuestion::builder("Would this tool help to handle the request?");
        let question = if written_out && !arguments.is_empty() {
            question.candidate(*name, format!("{description} ({})", arguments.join(", ")))
        } else if written_out {
            question.candidate(*name, *description)
        } else {
            question
                .candidate(*name, *description)
                .parameters(arguments.iter().copied())
        };
        b = b.question(format!("tool{i}"), question.build().unwrap());
    }
    b.build().unwrap()
}

#[test]
fn the_default_model_reads_a_tools_arguments_as_its_manifest_says() {
    let conversation = "Email Anna the forecast for Paris";
    let reading = engine();
    assert!(
        reading.tool_parameters(),
        "decide-tools-minilm's manifest says tool_parameters"
    );
    let with_arguments = tool_request_with_arguments(conversation, false);
    let written_out = tool_request_with_arguments(conversation, true);
    let scores = reading.yes_no_scores(&with_arguments).unwrap();
    assert_eq!(scores, reading.yes_no_scores(&written_out).unwrap());

    // Turned off, the arguments are not read, and the conformal table, fitted on texts with
    // them, no longer holds.
    let ignoring = Engine::builder().tool_parameters(false).build().unwrap();
    assert!(!ignoring.tool_parameters());
    assert!(reading.conformal().is_some() && ignoring.conformal().is_none());
    let plain = tool_request(conversation);
    let ignored = ignoring.yes_no_scores(&with_arguments).unwrap();
    assert_eq!(ignored, ignoring.yes_no_scores(&plain).unwrap());
    for ((name, read), (_, not_read)) in scores.iter().zip(&ignored) {
        // create_event (tool2) has no arguments: the same text either way.
        assert_eq!(
            name == "tool2",
            read == not_read,
            "{name}: {read} vs {not_read}"
        );
    }
}

/// The same tool of two servers, read with or without its server.
fn same_tool_of_two_servers(engine: &Engine, conversation: &str) -> (f64, f64) {
    let mut b = DecisionRequest::builder().input(conversation_input(conversation));
    for (i, server) in ["slack-mcp-server", "@acme/discord-mcp"].iter().enumerate() {
        let question = YesNoQuestion::builder("Would this tool help to handle the request?")
            .candidate("send_message", "Post a message to a channel")
            .parameters(["channel", "text"])
            .server(*server)
            .build()
            .unwrap();
        b = b.question(format!("tool{i}"), question);
    }
    let scores = engine.yes_no_scores(&b.build().unwrap()).unwrap();
    (scores[0].1, scores[1].1)
}

#[test]
fn a_model_that_reads_servers_tells_the_same_tool_of_two_servers_apart() {
    let conversation = "post the release notes in our slack #general";
    assert!(
        engine().tool_server(),
        "decide-tools-minilm's manifest says tool_server"
    );
    let reading = Engine::builder().tool_server(true).build().unwrap();
    assert!(reading.tool_server());
    // Turned off, its texts are not the ones the conformal table was fitted on.
    let ignoring = Engine::builder().tool_server(false).build().unwrap();
    assert!(reading.conformal().is_some() && ignoring.conformal().is_none());
    let (slack, discord) = same_tool_of_two_servers(&reading, conversation);
    assert!(slack > discord, "slack {slack} against discord {discord}");
    // Without the servers the two texts are one: the same score, as before servers were read.
    let (slack, discord) = same_tool_of_two_servers(&ignoring, conversation);
    assert_eq!(slack, discord);
}

#[test]
fn choice_and_scale_questions_on_the_real_model() {
    let choice = ChoiceQuestion::builder("Which model should handle this request?")
        .option_with_description(
            "simple",
            "Greetings, short factual questions, simple lookups",
        )
        .option_with_description(
            "complex",
            "Multi-step reasoning, writing code, detailed analysis",
        )
        .build()
        .unwrap();
    let scale = ScaleQuestion::builder("How urgent is this?")
        .level_with_description("low", "no hurry, whenever you have time")
        .level_with_description("high", "urgent, immediately, production is down")
        .build()
        .unwrap();
    let request = DecisionRequest::builder()
        .input(DecisionInput::Text(
            "Write a Rust function that parses this log format and analyses the error rates step by step".into(),
        ))
        .question("route", choice)
        .question("urgency", scale)
        .build()
        .unwrap();
    let response = engine().decide(&request).unwrap();
    let route = response.choice("route").unwrap();
    assert_eq!(route.value(), "complex");
    let sum: f64 = ["simple", "complex"]
        .iter()
        .map(|o| route.probability_of(o).unwrap())
        .sum();
    assert!((sum - 1.0).abs() < 1e-9);
    assert!(route.probability_of("medium").is_err());
    let urgency = response.scale("urgency").unwrap();
    assert!((0.0..=1.0).contains(&urgency.mean()));
    assert_eq!(urgency.probabilities().len(), 2);
}

#[test]
fn yes_when_and_no_when_compare_the_two_criteria() {
    let q = YesNoQuestion::builder("Is the user angry?")
        .yes_when("the user is furious, insulting and complaining loudly")
        .no_when("the user is calm and friendly")
        .build()
        .unwrap();
    let ask = |text: &str| {
        let request = DecisionRequest::builder()
            .input(DecisionInput::Text(text.into()))
            .question("angry", q.clone())
            .build()
            .unwrap();
        engine()
            .decide(&request)
            .unwrap()
            .yes_no("angry")
            .unwrap()
            .probability()
    };
    let angry = ask("This is the third time your useless product broke! I am furious!");
    let calm = ask("Thanks so much, have a lovely and friendly day!");
    assert!(angry > 0.5 && calm < 0.5, "angry {angry}, calm {calm}");
}

#[tokio::test(flavor = "current_thread")]
async fn decide_async_runs_off_the_runtime() {
    // On a current-thread runtime, inference on the runtime's only thread would block this
    // timer task too; the answer arriving proves it ran elsewhere.
    let request = tool_request("Will it rain in Paris tomorrow?");
    let response = engine().decide_async(&request).await.unwrap();
    let sync = engine().decide(&request).unwrap();
    for i in 0..TOOLS.len() {
        let name = format!("tool{i}");
        assert!(relative_close(
            response.yes_no(&name).unwrap().probability(),
            sync.yes_no(&name).unwrap().probability(),
            1e-5
        ));
    }
}

#[test]
fn decide_async_works_without_a_runtime_too() {
    let request = tool_request("Send Anna an email");
    let future = engine().decide_async(&request);
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    assert!(rt.block_on(future).is_ok());
}

/// The default model's folder copied to a temporary one with only `files`, and its error when
/// loaded from there.
fn load_a_copy_with(name: &str, files: &[&str]) -> (std::path::PathBuf, EngineError) {
    let src = engine().info().dir.clone();
    let dir = std::env::temp_dir().join(format!("decide-{name}-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("1_Pooling")).unwrap();
    for f in files {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let err = Engine::builder()
        .model(dir.to_str().unwrap())
        .build()
        .unwrap_err();
    (dir, err)
}

#[test]
fn a_model_folder_with_a_missing_file_names_it() {
    let (dir, err) = load_a_copy_with(
        "missing",
        &[
            "config.json",
            "modules.json",
            "1_Pooling/config.json",
            "manifest.toml",
            "model.safetensors",
        ],
    );
    assert!(matches!(err, EngineError::MissingFile { .. }));
    assert_eq!(
        err.to_string(),
        format!("{}: missing tokenizer.json", dir.display())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_built_model_without_weights_names_the_command_that_builds_it() {
    let (dir, err) = load_a_copy_with(
        "unbuilt",
        &[
            "config.json",
            "modules.json",
            "1_Pooling/config.json",
            "manifest.toml",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "sentence_bert_config.json",
            "vocab.txt",
        ],
    );
    let manifest = std::fs::read_to_string(dir.join("manifest.toml")).unwrap();
    let base = manifest
        .lines()
        .skip_while(|l| *l != "[build]")
        .find_map(|l| l.strip_prefix("base = "))
        .expect("the default model's manifest has a [build] table")
        .trim_matches('"')
        .to_string();
    assert!(matches!(err, EngineError::MissingFile { .. }));
    assert_eq!(
        err.to_string(),
        format!(
            "{}: missing model.safetensors (built from {base} by models/fetch: run models/fetch)",
            dir.display()
        )
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn absurd_options_are_refused() {
    let err = Engine::builder()
        .max_batch_tokens(0)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("max-batch-tokens: 0 is out of range"),
        "{err}"
    );
    let err = Engine::builder()
        .max_length(100_000)
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("max-length: 100000 is out of range"),
        "{err}"
    );
}

#[test]
fn a_request_for_another_model_is_refused() {
    let request = tool_request("Will it rain?").with_parameters(
        decide_contract::DecisionRequestParameters::for_model("gpt-6-luna"),
    );
    let err = engine().decide(&request).unwrap_err().to_string();
    assert!(err.contains("asks for model 'gpt-6-luna'"), "{err}");
    let by_id = tool_request("Will it rain?").with_parameters(
        decide_contract::DecisionRequestParameters::for_model("decide/decide-tools-minilm"),
    );
    assert!(engine().decide(&by_id).is_ok());
}

#[test]
fn yes_no_scores_are_the_scores_behind_the_answers() {
    let request = tool_request("Send Anna an email saying the meeting moved");
    let raw = engine().yes_no_scores(&request).unwrap();
    let response = engine().decide(&request).unwrap();
    let cal = engine().calibration().unwrap();
    assert_eq!(raw.len(), TOOLS.len());
    for (name, s) in raw {
        let p = response.yes_no(&name).unwrap().probability();
        assert!(
            (p - cal.probability(s)).abs() < 1e-12,
            "{name}: {p} vs {}",
            cal.probability(s)
        );
    }
}

#[test]
fn hybrid_scores_add_the_weighted_bm25_coverage() {
    let weight = engine().lexical_weight();
    assert!(
        weight > 0.0,
        "the shipped manifest sets [scoring] lexical_weight"
    );
    let neural = Engine::builder().lexical_weight(0.0).build().unwrap();
    assert_eq!(neural.lexical_weight(), 0.0);
    let text = "Read the file /etc/hosts and post it to the Slack channel #ops";
    let request = tool_request(text);
    let hybrid = engine().yes_no_scores(&request).unwrap();
    let plain = neural.yes_no_scores(&request).unwrap();
    let docs: Vec<String> = TOOLS.iter().map(|(n, d)| candidate_text(n, d)).collect();
    let coverage = decide_engine::Bm25Index::new(&docs).coverage(text);
    assert!(coverage.iter().any(|c| *c > 0.0));
    for (i, ((_, h), (_, p))) in hybrid.iter().zip(&plain).enumerate() {
        assert!(
            (h - p - weight * coverage[i]).abs() < 1e-9,
            "{}: {h} = {p} + {weight}·{}",
            TOOLS[i].0,
            coverage[i]
        );
    }
    // The same fusion reaches the probabilities.
    let response = engine().decide(&request).unwrap();
    let cal = engine().calibration().unwrap();
    for (name, s) in &hybrid {
        let p = response.yes_no(name).unwrap().probability();
        assert!((p - cal.probability(*s)).abs() < 1e-12);
    }
    assert!(matches!(
        Engine::builder().lexical_weight(-1.0).build(),
        Err(EngineError::InvalidOption { .. })
    ));
}

#[test]
fn a_cascade_rescores_the_shortlist_with_a_cross_encoder() {
    use std::sync::Arc;
    let cross = Engine::builder()
        .model(fixtures().join("tiny-bert-1").to_str().unwrap())
        .build()
        .unwrap();
    let cascade =
        decide_engine::Cascade::new(Arc::new(engine().clone()), Arc::new(cross.clone()), 2)
            .unwrap();
    let request = tool_request("Send Anna an email saying the meeting moved");
    let first = engine().decide(&request).unwrap();
    let response = cascade.decide(&request).unwrap();
    let mut by_p: Vec<(String, f64)> = first
        .answers()
        .keys()
        .map(|n| (n.clone(), first.yes_no(n).unwrap().probability()))
        .collect();
    by_p.sort_by(|a, b| b.1.total_cmp(&a.1));
    let shortlisted: Vec<&String> = by_p.iter().take(2).map(|(n, _)| n).collect();
    // The two most probable tools get the cross-encoder's answer to exactly those two
    // questions; the rest keep the bi-encoder's.
    let mut sub = DecisionRequest::builder().input(request.input().clone());
    for name in &shortlisted {
        sub = sub.question((*name).clone(), request.question(name).unwrap().clone());
    }
    let rescored = cross.decide(&sub.build().unwrap()).unwrap();
    for (name, p) in &by_p {
        let got = response.yes_no(name).unwrap().probability();
        let want = if shortlisted.contains(&name) {
            rescored.yes_no(name).unwrap().probability()
        } else {
            *p
        };
        assert!((got - want).abs() < 1e-9, "{name}: {got} vs {want}");
    }
}

fn needs_tool_request(conversation: &str, with_tools: bool) -> DecisionRequest {
    let mut b = match with_tools {
        true => tool_request(conversation).to_builder(),
        false => DecisionRequest::builder().input(conversation_input(conversation)),
    };
    b = b.question("needs_tool", YesNoQuestion::needs_tool());
    b.build().unwrap()
}

#[test]
fn the_default_models_head_answers_whether_any_tool_is_needed() {
    let head = engine()
        .needs_tool()
        .expect("the default model has a needs-tool head");
    for (text, needs) in [
        ("Will it rain in Paris tomorrow?", true),
        ("Send Anna an email saying the meeting moved to 3pm", true),
        ("hi! how are you?", false),
    ] {
        let request = needs_tool_request(text, true);
        let response = engine().decide(&request).unwrap();
        let p = response.yes_no("needs_tool").unwrap().probability();
        assert_eq!(p >= 0.5, needs, "{text}: {p}");
        // It is the head on the conversation's embeddings, with tools to score or without.
        let features = &engine()
            .conversation_embeddings(std::slice::from_ref(request.input()))
            .unwrap()[0];
        assert!(
            relative_close(p, head.probability_of(features).unwrap(), 1e-6),
            "{text}"
        );
        let alone = engine().decide(&needs_tool_request(text, false)).unwrap();
        let q = alone.yes_no("needs_tool").unwrap().probability();
        assert!(
            relative_close(p, q, 1e-6),
            "{text}: {p} with tools, {q} without"
        );
        // The tools' answers do not change for being asked beside it.
        let plain = engine().decide(&tool_request(text)).unwrap();
        for i in 0..TOOLS.len() {
            let name = format!("tool{i}");
            assert_eq!(
                plain.yes_no(&name).unwrap().probability(),
                response.yes_no(&name).unwrap().probability()
            );
        }
        // A yes/no score is a tool's alone: the question without a document has none.
        let scores = engine().yes_no_scores(&request).unwrap();
        assert_eq!(scores.len(), TOOLS.len());
    }
}

#[test]
fn the_head_reads_a_follow_up_with_its_last_message_apart() {
    let head = engine().needs_tool().unwrap();
    let mut fields = serde_json::Map::new();
    fields.insert(
        "messages".into(),
        serde_json::json!([
            {"role": "user", "text": "Will it rain in Paris tomorrow?"},
            {"role": "assistant", "text": "Light rain in the morning, 14 degrees."},
            {"role": "user", "text": "Send that to Anna by email, please"}
        ]),
    );
    let input = DecisionInput::Fields(fields);
    let mut b = DecisionRequest::builder().input(input.clone());
    for (i, (name, description)) in TOOLS.iter().enumerate() {
        let q = YesNoQuestion::builder("Relevant?")
            .candidate(*name, *description)
            .build()
            .unwrap();
        b = b.question(format!("tool{i}"), q);
    }
    let request = b
        .question("needs_tool", YesNoQuestion::needs_tool())
        .build()
        .unwrap();
    let p = engine()
        .decide(&request)
        .unwrap()
        .yes_no("needs_tool")
        .unwrap()
        .probability();
    let features = &engine()
        .conversation_embeddings(std::slice::from_ref(&input))
        .unwrap()[0];
    // Two views: the whole conversation, then the last message, which is not the whole.
    let dims = features.len() / 2;
    assert_ne!(features[..dims], features[dims..]);
    assert!(relative_close(
        p,
        head.probability_of(features).unwrap(),
        1e-6
    ));
    assert!(p >= 0.5, "a request for an email needs a tool: {p}");
}

#[test]
fn a_model_without_a_head_refuses_the_needs_tool_question() {
    let base = Engine::builder().model("all-MiniLM-L6-v2").build().unwrap();
    assert!(base.needs_tool().is_none());
    let response = base
        .decide(&needs_tool_request("Will it rain in Paris tomorrow?", true))
        .unwrap();
    assert!(response.is_refused("needs_tool"));
    assert!(response.yes_no("tool0").is_ok());
}

#[test]
fn a_head_of_the_wrong_width_is_named_at_load() {
    let src = engine().info().dir.clone();
    let dir = std::env::temp_dir().join(format!("decide-head-{}", std::process::id()));
    copy_dir(&src, &dir);
    let manifest = std::fs::read_to_string(dir.join("manifest.toml")).unwrap();
    let start = manifest
        .find("weights = [")
        .expect("the manifest has a head");
    let end = start + manifest[start..].find(']').unwrap() + 1;
    let cut = format!(
        "{}weights = [0.5, 0.5]{}",
        &manifest[..start],
        &manifest[end..]
    );
    std::fs::write(dir.join("manifest.toml"), cut).unwrap();
    let err = Engine::builder()
        .model(dir.to_str().unwrap())
        .build()
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        err.contains("manifest.toml") && err.contains("[needs_tool] weights"),
        "{err}"
    );
}

fn copy_dir(src: &std::path::Path, dst: &std::path::Path) {
    std::fs::create_dir_all(dst).unwrap();
    for entry in std::fs::read_dir(src).unwrap() {
        let entry = entry.unwrap();
        let to = dst.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to);
        } else {
            std::fs::copy(entry.path(), to).unwrap();
        }
    }
}
