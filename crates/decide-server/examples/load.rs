//! A load test of a running `decide serve`: N clients (threads, each with `HttpDecisionModel`)
//! send tool-selection requests in a loop for a fixed time; the summary gives throughput
//! (decisions/s), p50/p99 latency and every status seen.
//!
//! ```sh
//! decide serve --addr 127.0.0.1:8080 &                 # or with --no-batching
//! cargo run -p decide-server --example load -- http://127.0.0.1:8080 32 20
//! ```
//!
//! Every request asks about the same 12 tools (what agents sharing a server send) for one of
//! 48 different user messages, in the System One format.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use decide_contract::{DecisionError, DecisionModel, DecisionRequest, YesNoQuestion};
use decide_http::{ClientError, HttpDecisionModel, WireFormat};

const TOOLS: [(&str, &str); 12] = [
    ("get_weather", "Current weather and forecast for a city"),
    ("send_email", "Send an email to a contact"),
    ("create_invoice", "Create an invoice for a customer"),
    (
        "search_flights",
        "Search flights between two airports on a date",
    ),
    ("book_hotel", "Book a hotel room in a city for given dates"),
    ("translate_text", "Translate text into another language"),
    (
        "create_calendar_event",
        "Add an event to the user's calendar",
    ),
    (
        "query_database",
        "Run a read-only SQL query on the sales database",
    ),
    ("read_file", "Read a file from the user's workspace"),
    ("web_search", "Search the web for recent information"),
    ("convert_currency", "Convert an amount between currencies"),
    ("create_ticket", "Open a support ticket in the helpdesk"),
];

const SUBJECTS: [&str; 12] = [
    "Oslo",
    "my manager",
    "the Q3 report",
    "Lisbon",
    "next Tuesday",
    "the ACME account",
    "the deploy logs",
    "a flight to Tokyo",
    "500 euros",
    "the printer",
    "my landlord",
    "the weekly sync",
];
const ASKS: [&str; 4] = [
    "Can you help me with {}?",
    "I need something done about {} today",
    "Please check {} and tell me what to do",
    "What is going on with {} right now?",
];

fn request(i: usize) -> DecisionRequest {
    let text = ASKS[i % ASKS.len()].replace("{}", SUBJECTS[(i / ASKS.len()) % SUBJECTS.len()]);
    let mut b = DecisionRequest::builder().input(format!("{text} (request {i})"));
    for (name, description) in TOOLS {
        b = b.question(
            name,
            YesNoQuestion::builder("Is this tool needed to answer the user?")
                .candidate(name, description)
                .build()
                .unwrap(),
        );
    }
    b.build().unwrap()
}

fn status_of(error: &DecisionError) -> String {
    match error {
        DecisionError::Model(e) => match e.downcast_ref::<ClientError>() {
            Some(ClientError::Status { status, .. }) => status.to_string(),
            Some(other) => format!("transport: {other}"),
            None => e.to_string(),
        },
        other => other.to_string(),
    }
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let base = args
        .get(1)
        .cloned()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let clients: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(32);
    let seconds: f64 = args.get(3).and_then(|s| s.parse().ok()).unwrap_or(20.0);
    let label = args.get(4).cloned().unwrap_or_default();

    let latencies = Arc::new(Mutex::new(Vec::<f64>::new()));
    let statuses = Arc::new(Mutex::new(std::collections::BTreeMap::<String, u64>::new()));
    let started = Instant::now();
    let deadline = started + Duration::from_secs_f64(seconds);
    let threads: Vec<_> = (0..clients)
        .map(|c| {
            let (base, latencies, statuses) = (base.clone(), latencies.clone(), statuses.clone());
            std::thread::spawn(move || {
                let model = HttpDecisionModel::builder(&base)
                    .format(WireFormat::SystemOne)
                    .timeout(Duration::from_secs(60))
                    .build();
                let mut i = c;
                while Instant::now() < deadline {
                    let req = request(i);
                    i += clients;
                    let t = Instant::now();
                    let result = model.decide(&req);
                    let ms = t.elapsed().as_secs_f64() * 1000.0;
                    let status = match &result {
                        Ok(_) => {
                            latencies.lock().unwrap().push(ms);
                            "200".to_string()
                        }
                        Err(e) => status_of(e),
                    };
                    *statuses.lock().unwrap().entry(status).or_default() += 1;
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut lat = latencies.lock().unwrap().clone();
    lat.sort_by(f64::total_cmp);
    let ok = lat.len();
    let summary = serde_json::json!({
        "label": label,
        "clients": clients,
        "seconds": elapsed,
        "ok": ok,
        "statuses": *statuses.lock().unwrap(),
        "decisions_per_s": ok as f64 / elapsed,
        "questions_per_s": (ok * TOOLS.len()) as f64 / elapsed,
        "p50_ms": percentile(&lat, 0.5),
        "p99_ms": percentile(&lat, 0.99),
    });
    println!("{summary}");
}
