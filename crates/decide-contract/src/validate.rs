//! Checks a model's response against the request it answers.

use indexmap::IndexMap;

use crate::error::{DecisionError, Result};
use crate::request::{ChoiceQuestion, DecisionRequest, Question, ScaleQuestion};
use crate::response::{clamp_into, Answer, ChoiceAnswer, DecisionResponse, ScaleAnswer};

/// Checks `response` against `request` and returns it ready for callers.
///
/// [`DecisionModel::decide`](crate::DecisionModel::decide) runs this for every model, so callers
/// can trust any response they get. It fails with [`DecisionError::InvalidResponse`] when:
///
/// * a question has no answer, or an answer's name is not a question of the request;
/// * an answer has the wrong type for its question;
/// * a choice value is not among the options, or a probability is keyed by an option that was
///   not offered;
/// * a probability or confidence is NaN or outside [0, 1];
/// * a scale mean is not finite or outside [0, n-1], or the number of scale probabilities is
///   neither 0 nor n.
///
/// Refusals pass. Values within [`TOLERANCE`](crate::TOLERANCE) of their range are clamped. The
/// answers come back in question order, and every [`ChoiceAnswer`] carries the question's options
/// so that [`ChoiceAnswer::probability_of`] can reject misspelled options.
pub fn validate(request: &DecisionRequest, response: DecisionResponse) -> Result<DecisionResponse> {
    let mut response = response;
    let mut answers = std::mem::take(&mut response.answers);
    if let Some(stray) = answers.keys().find(|n| request.question(n).is_none()) {
        return Err(invalid(format!(
            "the response answers '{stray}', which is not a question of the request"
        )));
    }
    let mut checked = IndexMap::with_capacity(answers.len());
    for (name, question) in request.questions() {
        // Order is rebuilt from the questions, so the O(1) removal will do (shifting would
        // make a 1,000-question response quadratic).
        let answer = answers.swap_remove(name).ok_or_else(|| {
            invalid(format!(
                "the response contains no answer to question '{name}'"
            ))
        })?;
        let answer =
            check(question, answer).map_err(|msg| invalid(format!("question '{name}': {msg}")))?;
        checked.insert(name.clone(), answer);
    }
    response.answers = checked;
    Ok(response)
}

fn invalid(message: String) -> DecisionError {
    DecisionError::InvalidResponse(message)
}

fn check(question: &Question, answer: Answer) -> Result<Answer, String> {
    match (question, answer) {
        (_, refusal @ Answer::Refusal { .. }) => Ok(refusal),
        (Question::YesNo(_), Answer::YesNo(mut a)) => {
            a.probability = clamp_into(a.probability, 0.0, 1.0, "probability")?;
            Ok(Answer::YesNo(a))
        }
        (Question::Choice(q), Answer::Choice(a)) => check_choice(q, a).map(Answer::Choice),
        (Question::Scale(q), Answer::Scale(a)) => check_scale(q, a).map(Answer::Scale),
        (question, answer) => Err(format!(
            "got a {} answer to a {} question",
            answer.kind(),
            question.answer_kind()
        )),
    }
}

fn check_choice(
    question: &ChoiceQuestion,
    mut answer: ChoiceAnswer,
) -> Result<ChoiceAnswer, String> {
    let options = || question.option_names().collect::<Vec<_>>().join(", ");
    if !question.has_option(&answer.value) {
        return Err(format!(
            "the chosen value '{}' is not an option (options: {})",
            answer.value,
            options()
        ));
    }
    for (option, p) in answer.probabilities.iter_mut() {
        if !question.has_option(option) {
            return Err(format!(
                "a probability is given for '{option}', which is not an option (options: {})",
                options()
            ));
        }
        *p = clamp_into(*p, 0.0, 1.0, &format!("probability of '{option}'"))?;
    }
    answer.confidence = check_confidence(answer.confidence)?;
    answer.options = question.option_names().map(str::to_owned).collect();
    Ok(answer)
}

fn check_scale(question: &ScaleQuestion, mut answer: ScaleAnswer) -> Result<ScaleAnswer, String> {
    let n = question.levels().len();
    let top = (n - 1) as f64;
    if !answer.mean.is_finite() {
        return Err(format!("scale mean {} is not finite", answer.mean));
    }
    answer.mean = clamp_into(answer.mean, 0.0, top, "scale mean")?;
    if !answer.probabilities.is_empty() && answer.probabilities.len() != n {
        return Err(format!(
            "got {} scale probabilities for {n} levels",
            answer.probabilities.len()
        ));
    }
    for (i, p) in answer.probabilities.iter_mut().enumerate() {
        *p = clamp_into(*p, 0.0, 1.0, &format!("probability of level {i}"))?;
    }
    answer.confidence = check_confidence(answer.confidence)?;
    Ok(answer)
}

fn check_confidence(confidence: Option<f64>) -> Result<Option<f64>, String> {
    confidence
        .map(|c| clamp_into(c, 0.0, 1.0, "confidence"))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::request::{ChoiceQuestion, ScaleQuestion, YesNoQuestion};
    use crate::response::{YesNoAnswer, TOLERANCE};

    fn request() -> DecisionRequest {
        DecisionRequest::builder()
            .input("x")
            .question("urgent", YesNoQuestion::new("Urgent?").unwrap())
            .question(
                "route",
                ChoiceQuestion::with_options("Which?", ["a", "b", "c"]).unwrap(),
            )
            .question(
                "level",
                ScaleQuestion::with_levels("How much?", ["low", "mid", "high"]).unwrap(),
            )
            .build()
            .unwrap()
    }

    fn answers(route: Answer, level: Answer) -> DecisionResponse {
        DecisionResponse::builder()
            .answer("level", level)
            .answer("urgent", Answer::yes_no(0.4).unwrap())
            .answer("route", route)
            .build()
            .unwrap()
    }

    fn good() -> DecisionResponse {
        answers(
            ChoiceAnswer::new("b")
                .with_probabilities([("b", 0.6), ("a", 0.3)])
                .unwrap()
                .into(),
            ScaleAnswer::from_probabilities(vec![0.2, 0.3, 0.5])
                .unwrap()
                .into(),
        )
    }

    fn rejected(response: DecisionResponse) -> String {
        match validate(&request(), response) {
            Err(DecisionError::InvalidResponse(msg)) => msg,
            other => panic!("expected InvalidResponse, got {other:?}"),
        }
    }

    #[test]
    fn valid_response_passes_in_question_order() {
        let r = validate(&request(), good()).unwrap();
        let names: Vec<_> = r.answers().keys().map(String::as_str).collect();
        assert_eq!(names, ["urgent", "route", "level"]);
    }

    #[test]
    fn fills_choice_options_from_the_question() {
        let r = validate(&request(), good()).unwrap();
        let choice = r.choice("route").unwrap();
        assert_eq!(choice.options(), ["a", "b", "c"]);
        assert_eq!(choice.probability_of("c").unwrap(), 0.0);
        assert!(choice.probability_of("d").is_err());
    }

    #[test]
    fn missing_answer_is_rejected() {
        let r = DecisionResponse::builder()
            .answer("urgent", Answer::yes_no(0.4).unwrap())
            .build()
            .unwrap();
        assert_eq!(
            rejected(r),
            "the response contains no answer to question 'route'"
        );
    }

    #[test]
    fn answer_to_unknown_question_is_rejected() {
        let r = good()
            .to_builder()
            .answer("extra", Answer::refusal())
            .build()
            .unwrap();
        assert_eq!(
            rejected(r),
            "the response answers 'extra', which is not a question of the request"
        );
    }

    #[test]
    fn wrong_answer_type_is_rejected() {
        let r = answers(
            Answer::yes_no(0.5).unwrap(),
            ScaleAnswer::new(1.0).unwrap().into(),
        );
        assert_eq!(
            rejected(r),
            "question 'route': got a yes/no answer to a choice question"
        );
    }

    #[test]
    fn refusals_pass() {
        let r = answers(Answer::refusal(), Answer::refusal_because("no"));
        let r = validate(&request(), r).unwrap();
        assert!(r.is_refused("route"));
        assert!(r.is_refused("level"));
    }

    #[test]
    fn choice_value_must_be_an_option() {
        let r = answers(
            ChoiceAnswer::new("B").into(),
            ScaleAnswer::new(1.0).unwrap().into(),
        );
        assert_eq!(
            rejected(r),
            "question 'route': the chosen value 'B' is not an option (options: a, b, c)"
        );
    }

    #[test]
    fn choice_probability_for_unknown_option_is_rejected() {
        let r = answers(
            ChoiceAnswer::new("a")
                .with_probabilities([("a", 0.5), ("z", 0.5)])
                .unwrap()
                .into(),
            ScaleAnswer::new(1.0).unwrap().into(),
        );
        assert_eq!(
            rejected(r),
            "question 'route': a probability is given for 'z', which is not an option (options: a, b, c)"
        );
    }

    #[test]
    fn probabilities_out_of_range_or_nan_are_rejected() {
        // Constructors refuse such values, so they are planted directly, as a careless model
        // implementation inside this crate could.
        let mut choice = ChoiceAnswer::new("a");
        choice.probabilities.insert("a".into(), 1.5);
        let r = answers(choice.into(), ScaleAnswer::new(1.0).unwrap().into());
        assert_eq!(
            rejected(r),
            "question 'route': probability of 'a' 1.5 is outside [0, 1]"
        );

        let mut r = good();
        r.answers.insert(
            "urgent".into(),
            Answer::YesNo(YesNoAnswer {
                probability: f64::NAN,
            }),
        );
        assert!(rejected(r).starts_with("question 'urgent': probability NaN"));

        let mut scale = ScaleAnswer::new(1.0).unwrap();
        scale.probabilities = vec![0.1, -0.2, 0.3];
        let r = answers(ChoiceAnswer::new("a").into(), scale.into());
        assert_eq!(
            rejected(r),
            "question 'level': probability of level 1 -0.2 is outside [0, 1]"
        );

        let mut choice = ChoiceAnswer::new("a");
        choice.confidence = Some(7.0);
        let r = answers(choice.into(), ScaleAnswer::new(1.0).unwrap().into());
        assert_eq!(
            rejected(r),
            "question 'route': confidence 7 is outside [0, 1]"
        );
    }

    #[test]
    fn near_range_values_are_clamped() {
        let mut choice = ChoiceAnswer::new("a");
        choice
            .probabilities
            .insert("a".into(), 1.0 + TOLERANCE / 2.0);
        let mut scale = ScaleAnswer::new(1.0).unwrap();
        scale.mean = 2.0 + TOLERANCE / 2.0;
        let r = validate(&request(), answers(choice.into(), scale.into())).unwrap();
        assert_eq!(r.choice("route").unwrap().probability_of("a").unwrap(), 1.0);
        assert_eq!(r.scale("level").unwrap().mean(), 2.0);
    }

    #[test]
    fn scale_mean_out_of_range_is_rejected() {
        let r = answers(
            ChoiceAnswer::new("a").into(),
            ScaleAnswer::new(2.5).unwrap().into(),
        );
        assert_eq!(
            rejected(r),
            "question 'level': scale mean 2.5 is outside [0, 2]"
        );
    }

    #[test]
    fn scale_mean_not_finite_is_rejected() {
        let mut scale = ScaleAnswer::new(1.0).unwrap();
        scale.mean = f64::INFINITY;
        let r = answers(ChoiceAnswer::new("a").into(), scale.into());
        assert_eq!(
            rejected(r),
            "question 'level': scale mean inf is not finite"
        );
    }

    #[test]
    fn scale_probability_count_must_match_levels() {
        let r = answers(
            ChoiceAnswer::new("a").into(),
            ScaleAnswer::from_probabilities(vec![0.5, 0.5])
                .unwrap()
                .into(),
        );
        assert_eq!(
            rejected(r),
            "question 'level': got 2 scale probabilities for 3 levels"
        );
        let ok = answers(
            ChoiceAnswer::new("a").into(),
            ScaleAnswer::new(0.0).unwrap().into(),
        );
        assert!(validate(&request(), ok).is_ok(), "no probabilities is fine");
    }

    #[test]
    fn metadata_is_kept() {
        let r = good()
            .to_builder()
            .model_name("m")
            .token_usage(crate::TokenUsage::new(9))
            .build()
            .unwrap();
        let r = validate(&request(), r).unwrap();
        assert_eq!(r.model_name(), Some("m"));
        assert_eq!(r.token_usage(), Some(crate::TokenUsage::new(9)));
    }
}
