//! From a request to documents, and from the documents' raw scores back to answers.
//!
//! Every question of a request names the documents it is about ([`plan`]); the model scores
//! each distinct document once against the input; [`respond`] turns the raw scores into
//! calibrated answers.

use decide_contract::indexmap::IndexSet;
use decide_contract::{
    Answer, ChoiceAnswer, DecisionError, DecisionRequest, DecisionResponse, Question, ScaleAnswer,
    TokenUsage, YesNoAnswer,
};

use crate::calibration::{sigmoid, softmax, Calibration};

/// The text a candidate is scored as: `name: description`, or the name alone when the
/// description adds nothing.
pub fn candidate_text(name: &str, description: &str) -> String {
    tool_text(name, description, &[])
}

/// The most parameter names a tool's text carries: a long schema would crowd the description
/// out of the model's input.
pub const MAX_TEXT_PARAMETERS: usize = 10;

/// The text a tool is scored as by a model that reads its parameters (`[scoring]
/// tool_parameters` in its manifest): [`candidate_text`] followed by the first
/// [`MAX_TEXT_PARAMETERS`] names in brackets, `get_forecast: Get the forecast. (latitude,
/// longitude)`, which reads like the call the tool is.
pub fn tool_text(name: &str, description: &str, parameters: &[String]) -> String {
    let description = description.trim();
    let described = !(description.is_empty() || description == name);
    let shown = parameters.len().min(MAX_TEXT_PARAMETERS);
    match (described, shown) {
        (false, 0) => name.to_string(),
        (true, 0) => format!("{name}: {description}"),
        (false, _) => format!("{name}: ({})", parameters[..shown].join(", ")),
        (true, _) => format!("{name}: {description} ({})", parameters[..shown].join(", ")),
    }
}

/// The words of a server's name that a tool's text carries: the part after the last `/`
/// (a package scope names the author, not the product), split at `-`, `_` and spaces, without
/// the words `mcp` and `server` that nearly every server's name has; `None` when nothing is
/// left (`@acme/slack-mcp-server` reads `slack`, `mcp` nothing).
pub fn server_label(server: &str) -> Option<String> {
    let name = server.trim().trim_start_matches('@');
    let last = name.rsplit('/').next().unwrap_or(name);
    let words: Vec<&str> = last
        .split(|c: char| c == '-' || c == '_' || c.is_whitespace())
        .filter(|w| !w.is_empty())
        .filter(|w| !w.eq_ignore_ascii_case("mcp") && !w.eq_ignore_ascii_case("server"))
        .collect();
    (!words.is_empty()).then(|| words.join(" "))
}

/// The text a tool is scored as by a model that reads its server (`[scoring] tool_server` in
/// its manifest): [`tool_text`] with the server's [`server_label`] in brackets before the
/// description, `send_message: [slack] Posts a message (channel, text)`. Catalogues of many
/// servers hold tools of the same name and purpose, and users name the product they mean.
/// Without a server (or a label), [`tool_text`].
pub fn served_tool_text(
    name: &str,
    description: &str,
    parameters: &[String],
    server: Option<&str>,
) -> String {
    let Some(label) = server.and_then(server_label) else {
        return tool_text(name, description, parameters);
    };
    // A candidate without a description carries its name in its place.
    let description = description.trim();
    let labelled = if description.is_empty() || description == name {
        format!("[{label}]")
    } else {
        format!("[{label}] {description}")
    };
    tool_text(name, &labelled, parameters)
}

/// Which documents a question needs, as indexes into the request's deduplicated documents.
pub(crate) enum Plan {
    YesNo {
        yes: usize,
        no: Option<usize>,
    },
    Options(Vec<usize>),
    /// [`YesNoQuestion::needs_tool`](decide_contract::YesNoQuestion::needs_tool): no document;
    /// answered from the input's embedding by the model's needs-tool head, if it has one.
    NeedsTool,
}

/// The request's distinct documents, in first-seen order; a question refers to them by index.
#[derive(Default)]
pub(crate) struct Documents(IndexSet<String>);

impl Documents {
    // A set rather than a searched list: a catalogue of 1,000 tools would cost half a million
    // string comparisons a decision.
    fn add(&mut self, text: String) -> usize {
        self.0.insert_full(text).0
    }

    /// The documents as text, in index order.
    pub(crate) fn refs(&self) -> Vec<&str> {
        self.0.iter().map(String::as_str).collect()
    }
}

/// With `parameters`, a candidate's text carries its parameter names ([`tool_text`]); with
/// `server`, its server's name ([`served_tool_text`]).
pub(crate) fn plan(
    request: &DecisionRequest,
    parameters: bool,
    server: bool,
) -> (Documents, Vec<Plan>) {
    let mut docs = Documents::default();
    let mut plans = Vec::new();
    for question in request.questions().values() {
        plans.push(match question {
            Question::YesNo(q) if q.is_needs_tool() => Plan::NeedsTool,
            Question::YesNo(q) => {
                let yes = match (q.yes_when(), q.candidate()) {
                    (Some(when), _) => when.to_string(),
                    (None, Some(c)) => {
                        let read: &[String] = if parameters { &c.parameters } else { &[] };
                        let from = c.server.as_deref().filter(|_| server);
                        served_tool_text(&c.name, &c.description, read, from)
                    }
                    (None, None) => q.text().to_string(),
                };
                Plan::YesNo {
                    yes: docs.add(yes),
                    no: q.no_when().map(|n| docs.add(n.to_string())),
                }
            }
            Question::Choice(q) => Plan::Options(
                q.options()
                    .iter()
                    .map(|o| docs.add(candidate_text(&o.name, &o.description)))
                    .collect(),
            ),
            Question::Scale(q) => Plan::Options(
                q.levels()
                    .iter()
                    .map(|l| {
                        docs.add(candidate_text(
                            &l.label,
                            l.description.as_deref().unwrap_or(""),
                        ))
                    })
                    .collect(),
            ),
        });
    }
    (docs, plans)
}

fn answer(
    question: &Question,
    plan: &Plan,
    scores: &[f64],
    cal: Calibration,
    needs_tool: Option<f64>,
) -> Result<Answer, DecisionError> {
    Ok(match (question, plan) {
        (_, Plan::NeedsTool) => match needs_tool {
            Some(p) => Answer::YesNo(YesNoAnswer::new(p)?),
            None => Answer::refusal_because(
                "the model has no needs-tool head to answer whether any tool is needed",
            ),
        },
        (Question::YesNo(_), Plan::YesNo { yes, no }) => {
            let p = match no {
                // Both criteria given: which one the input matches better decides, so the
                // offset cancels and only the slope applies.
                Some(no) => sigmoid(cal.a * (scores[*yes] - scores[*no])),
                None => cal.probability(scores[*yes]),
            };
            Answer::YesNo(YesNoAnswer::new(p)?)
        }
        (Question::Choice(q), Plan::Options(idx)) => {
            let logits: Vec<f64> = idx.iter().map(|&i| cal.a * scores[i]).collect();
            let probs = softmax(&logits);
            let best = argmax(&probs);
            let names: Vec<String> = q.options().iter().map(|o| o.name.clone()).collect();
            Answer::Choice(
                ChoiceAnswer::new(names[best].clone())
                    .with_probabilities(names.into_iter().zip(probs.iter().copied()))?
                    .with_confidence(probs[best])?,
            )
        }
        (Question::Scale(_), Plan::Options(idx)) => {
            let logits: Vec<f64> = idx.iter().map(|&i| cal.a * scores[i]).collect();
            let probs = softmax(&logits);
            let mean = probs.iter().enumerate().map(|(i, p)| i as f64 * p).sum();
            let confidence = probs[argmax(&probs)];
            Answer::Scale(
                ScaleAnswer::new(mean)?
                    .with_probabilities(probs)?
                    .with_confidence(confidence)?,
            )
        }
        _ => {
            return Err(DecisionError::UnsupportedFeature(format!(
                "question type of '{}'",
                question.text()
            )))
        }
    })
}

fn argmax(v: &[f64]) -> usize {
    v.iter()
        .enumerate()
        .fold((0, f64::NEG_INFINITY), |best, (i, &x)| {
            if x > best.1 {
                (i, x)
            } else {
                best
            }
        })
        .0
}

/// The raw score behind each yes/no question of `request`: its document's, or with both
/// criteria the difference of the two. The needs-tool question has no document, and so no raw
/// score: it is left out.
pub(crate) fn yes_no_raw(
    request: &DecisionRequest,
    plans: &[Plan],
    raw: &[f64],
) -> Result<Vec<(String, f64)>, DecisionError> {
    request
        .questions()
        .keys()
        .zip(plans)
        .filter(|(_, plan)| !matches!(plan, Plan::NeedsTool))
        .map(|(name, plan)| match plan {
            Plan::YesNo { yes, no: None } => Ok((name.clone(), raw[*yes])),
            Plan::YesNo { yes, no: Some(no) } => Ok((name.clone(), raw[*yes] - raw[*no])),
            _ => Err(DecisionError::UnsupportedFeature(format!(
                "question '{name}' is not a yes/no question"
            ))),
        })
        .collect()
}

/// What [`respond`] answers a request from: the raw scores of its documents, and the
/// needs-tool head's probability for its input when the model has one.
pub(crate) struct Scored<'a> {
    pub(crate) raw: &'a [f64],
    pub(crate) needs_tool: Option<f64>,
}

/// The response to `request` from the raw scores of its documents.
pub(crate) fn respond(
    request: &DecisionRequest,
    plans: &[Plan],
    scored: Scored<'_>,
    calibration: Calibration,
    model_name: &str,
    tokens: usize,
) -> Result<DecisionResponse, DecisionError> {
    let mut response = DecisionResponse::builder()
        .model_name(model_name.to_string())
        .token_usage(TokenUsage::new(tokens as u64));
    for ((name, question), plan) in request.questions().iter().zip(plans) {
        let answer = answer(question, plan, scored.raw, calibration, scored.needs_tool)?;
        response = response.answer(name.clone(), answer);
    }
    response.build()
}

#[cfg(test)]
mod tests {
    use decide_contract::YesNoQuestion;

    use super::*;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("p{i}")).collect()
    }

    #[test]
    fn a_tools_text_reads_like_its_call() {
        let two = ["latitude".to_string(), "longitude".to_string()];
        assert_eq!(
            tool_text("get_forecast", " Get the forecast. ", &two),
            "get_forecast: Get the forecast. (latitude, longitude)"
        );
        // Without a description worth reading, the arguments follow the name.
        assert_eq!(tool_text("now", "", &two), "now: (latitude, longitude)");
        assert_eq!(tool_text("now", "now", &two), "now: (latitude, longitude)");
        // Without arguments it is the candidate's text.
        assert_eq!(
            tool_text("now", "The time", &[]),
            candidate_text("now", "The time")
        );
        assert_eq!(tool_text("now", " ", &[]), "now");
    }

    #[test]
    fn a_long_schema_shows_its_first_names_only() {
        let text = tool_text("t", "d", &names(MAX_TEXT_PARAMETERS + 5));
        let shown = names(MAX_TEXT_PARAMETERS).join(", ");
        assert_eq!(text, format!("t: d ({shown})"));
    }

    #[test]
    fn a_plan_reads_the_parameters_only_when_asked() {
        let question = YesNoQuestion::builder("Relevant?")
            .candidate("read_file", "Read a file")
            .parameters(["path"])
            .build()
            .unwrap();
        let request = DecisionRequest::builder()
            .input(decide_contract::DecisionInput::Text(
                "open notes.txt".into(),
            ))
            .question("tool0", question)
            .build()
            .unwrap();
        assert_eq!(
            plan(&request, true, false).0.refs(),
            ["read_file: Read a file (path)"]
        );
        assert_eq!(
            plan(&request, false, false).0.refs(),
            ["read_file: Read a file"]
        );
    }

    #[test]
    fn a_servers_label_is_the_products_words() {
        let cases = [
            ("@john-zhang-dev/xero-mcp-server", Some("xero")),
            ("slack", Some("slack")),
            ("mcp-obsidian", Some("obsidian")),
            ("Asset Price MCP", Some("Asset Price")),
            ("mcp-servers/everything", Some("everything")),
            ("brave_search", Some("brave search")),
            ("mcp", None),
            (" @scope/ ", None),
            ("", None),
        ];
        for (server, label) in cases {
            assert_eq!(server_label(server).as_deref(), label, "{server:?}");
        }
    }

    #[test]
    fn a_plan_reads_the_server_only_when_asked_and_only_when_named() {
        let tool = |server: Option<&str>, description: &str| {
            let mut q = YesNoQuestion::builder("Relevant?")
                .candidate("send_message", description)
                .parameters(["channel"]);
            if let Some(s) = server {
                q = q.server(s);
            }
            let request = DecisionRequest::builder()
                .input(decide_contract::DecisionInput::Text("post it".into()))
                .question("tool0", q.build().unwrap())
                .build()
                .unwrap();
            (
                plan(&request, true, true).0.refs()[0].to_string(),
                plan(&request, true, false).0.refs()[0].to_string(),
            )
        };
        let (read, unread) = tool(Some("slack-mcp-server"), "Posts a message");
        assert_eq!(read, "send_message: [slack] Posts a message (channel)");
        assert_eq!(unread, "send_message: Posts a message (channel)");
        // No description: the label stands alone where it would be.
        let (read, _) = tool(Some("slack"), "");
        assert_eq!(read, "send_message: [slack] (channel)");
        // No server, or one whose name says nothing: the text as without the option.
        assert_eq!(tool(None, "Posts a message").0, unread);
        assert_eq!(tool(Some("mcp"), "Posts a message").0, unread);
    }
}
