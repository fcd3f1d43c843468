//! The synthetic decision that `decide bench` times and `examples/timing.rs` takes apart: a
//! conversation of alternating user and assistant turns, and one yes/no question per tool.
//! One definition, so both measure the same work.

use decide_contract::{DecisionInput, DecisionRequest, Result, YesNoQuestion};

/// A conversation of `messages` turns (user first), each a short request on one of five topics.
pub fn conversation(messages: usize) -> DecisionInput {
    let topics = [
        "book a table for four tomorrow evening",
        "what is the weather in Lisbon this weekend",
        "send the quarterly report to Ana and cc the finance team",
        "find the cheapest flight from Berlin to Porto in March",
        "summarize the open issues in the decide repository",
    ];
    let messages: Vec<serde_json::Value> = (0..messages)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let text = format!("{} (message {i})", topics[i % topics.len()]);
            serde_json::json!({"role": role, "text": text})
        })
        .collect();
    let mut fields = serde_json::Map::new();
    fields.insert("messages".into(), serde_json::Value::Array(messages));
    DecisionInput::Fields(fields)
}

/// A request asking, for each of `tools` distinct tools, whether `input` needs it.
pub fn tool_request(tools: usize, input: &DecisionInput) -> Result<DecisionRequest> {
    let mut builder = DecisionRequest::builder().input(input.clone());
    for i in 0..tools {
        let question = YesNoQuestion::builder("Does the conversation need this tool?")
            .candidate(
                format!("tool_{i}"),
                format!(
                    "Performs operation {i} of service {} for the user: looks up, creates or \
                     updates records and returns them",
                    i % 37
                ),
            )
            .build()?;
        builder = builder.question(format!("tool{i}"), question);
    }
    builder.build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_conversation_and_request_have_the_requested_sizes() {
        let input = conversation(10);
        assert_eq!(input.render().lines().count(), 10);
        assert!(input.last_user_text().is_some());
        let request = tool_request(3, &input).unwrap();
        assert_eq!(request.questions().len(), 3);
    }
}
