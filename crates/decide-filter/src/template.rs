//! The question asked about each tool, from a `{{name}}` / `{{description}}` template.

use crate::error::FilterError;

/// The default question: LangChain4j's `DEFAULT_QUESTION_TEMPLATE`, so that decision models trained or prompted for
/// LangChain4j read the same words.
pub const DEFAULT_QUESTION_TEMPLATE: &str =
    "Would this tool help to handle the request?\nTool: {{name}}\nDescription: {{description}}";

const OPTION: &str = "question_template";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Name,
    Description,
}

/// A parsed question template.
///
/// It is parsed once, when the filter is built, so that a typo fails at start-up rather than on the first user
/// message, and rendered in one pass, so that a description that itself contains `{{name}}` is not expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuestionTemplate {
    source: String,
    parts: Vec<Part>,
}

impl QuestionTemplate {
    /// Parses `template`: it must contain `{{name}}` and may use no variable but `{{name}}` and
    /// `{{description}}` (spaces inside the braces are allowed). A `{{` without a closing `}}` is plain text.
    pub fn parse(template: &str) -> Result<Self, FilterError> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find("{{") {
            let Some(close) = rest[open + 2..].find("}}") else {
                break;
            };
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let variable = rest[open + 2..open + 2 + close].trim();
            parts.push(match variable {
                "name" => Part::Name,
                "description" => Part::Description,
                other => {
                    return Err(FilterError::config(
                        OPTION,
                        format!(
                            "the template can only use the {{{{name}}}} and {{{{description}}}} variables, \
                             but uses {{{{{other}}}}}: {template:?}"
                        ),
                    ))
                }
            });
            rest = &rest[open + 2 + close + 2..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        if !parts.contains(&Part::Name) {
            return Err(FilterError::config(
                OPTION,
                format!("the template must contain {{{{name}}}}, but was: {template:?}"),
            ));
        }
        Ok(Self {
            source: template.to_owned(),
            parts,
        })
    }

    /// The question for one tool, trimmed: a tool without a description gives `...Description:`, with no trailing
    /// space, as in LangChain4j.
    pub fn render(&self, name: &str, description: Option<&str>) -> String {
        let description = description.map(str::trim).unwrap_or("");
        let mut text = String::new();
        for part in &self.parts {
            match part {
                Part::Text(t) => text.push_str(t),
                Part::Name => text.push_str(name),
                Part::Description => text.push_str(description),
            }
        }
        text.trim().to_owned()
    }

    /// The template as it was given.
    pub fn as_str(&self) -> &str {
        &self.source
    }
}

impl Default for QuestionTemplate {
    fn default() -> Self {
        Self {
            source: DEFAULT_QUESTION_TEMPLATE.to_owned(),
            parts: vec![
                Part::Text("Would this tool help to handle the request?\nTool: ".to_owned()),
                Part::Name,
                Part::Text("\nDescription: ".to_owned()),
                Part::Description,
            ],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_matches_its_source() {
        assert_eq!(
            QuestionTemplate::parse(DEFAULT_QUESTION_TEMPLATE).unwrap(),
            QuestionTemplate::default()
        );
    }

    #[test]
    fn renders_in_one_pass_and_trims() {
        let template =
            QuestionTemplate::parse("  Is {{ name }} ({{description}}) useful? ").unwrap();
        assert_eq!(
            template.render("a", Some("says {{name}}")),
            "Is a (says {{name}}) useful?"
        );
        assert_eq!(template.render("a", None), "Is a () useful?");
        assert_eq!(
            template.as_str(),
            "  Is {{ name }} ({{description}}) useful? "
        );
        let default = QuestionTemplate::default();
        assert_eq!(
            default.render("get_forecast", Some("  ")),
            "Would this tool help to handle the request?\nTool: get_forecast\nDescription:"
        );
    }

    #[test]
    fn unclosed_braces_are_text() {
        let template = QuestionTemplate::parse("{{name}} {{ oops").unwrap();
        assert_eq!(template.render("t", None), "t {{ oops");
    }

    #[test]
    fn rejects_missing_name_and_unknown_variables() {
        let error = QuestionTemplate::parse("Is {{description}} useful?").unwrap_err();
        assert_eq!(
            error.to_string(),
            "question_template: the template must contain {{name}}, but was: \"Is {{description}} useful?\""
        );
        let error = QuestionTemplate::parse("Is {{name}} useful for {{user}}?").unwrap_err();
        assert_eq!(
            error.to_string(),
            "question_template: the template can only use the {{name}} and {{description}} variables, \
             but uses {{user}}: \"Is {{name}} useful for {{user}}?\""
        );
        assert!(QuestionTemplate::parse("{{{name}}}").is_err());
        assert!(QuestionTemplate::parse("").is_err());
    }
}
