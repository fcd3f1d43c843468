//! The `#[tool]` and `#[tools]` attributes of `decide-agent`: a tool specification and an executor generated from a
//! plain Rust function or method.
//!
//! Use them through `decide_agent` (`use decide_agent::{tool, tools};`), which re-exports them and holds the runtime
//! helpers the generated code calls; the generated code names `::decide_agent`, so the crate must be a dependency.
//!
//! # What is generated
//!
//! * `#[tool("Calculates the length of a string")] fn string_length(s: String) -> usize` keeps the function and adds
//!   `fn string_length_tool() -> decide_agent::Tool` (same visibility).
//! * `#[tools] impl Calculator { #[tool("...")] fn add(&self, a: i64, b: i64) -> i64 { .. } ... }` keeps the methods
//!   and implements `decide_agent::ToolBox` for the type: `Arc::new(calculator).into_tools()` gives one tool per
//!   `#[tool]` method, in declaration order. Methods take `&self` or no receiver.
//!
//! # Rules
//!
//! * **Name**: the function's name, or `#[tool(name = "stringLength", ...)]`.
//! * **Description**: the attribute's string (`#[tool("...")]` or `description = "..."`), else the doc comment; none
//!   if neither is given.
//! * **Parameters**: every parameter is a JSON property named after it, its schema derived from its type by
//!   `schemars` (the type must implement `JsonSchema` and `Deserialize`), its description from its doc comment
//!   (`/// the word` before the parameter). A parameter whose type is `Option<..>` is not required. A parameter of
//!   type `InvocationContext` or `&InvocationContext` is not a property: it receives the caller's context.
//! * **Execution**: a synchronous function runs on the blocking pool; an `async fn` runs as a task. A return type
//!   named `Result` makes `Err(e)` a failed call (its `Display` text goes to the LLM); any other return value is
//!   serialised (a string as is, `()` as `Success`, anything else as compact JSON).
//!
//! Patterns in parameters (`(a, b): (i32, i32)`), `&mut self`, `self` by value and generic functions are refused at
//! compile time with an error naming the item: the LLM calls tools by name with JSON, which none of them fits.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{
    Attribute, Expr, ExprLit, FnArg, Ident, ImplItem, ItemFn, ItemImpl, Lit, LitStr, Meta, Pat,
    ReturnType, Signature, Token, Type,
};

/// Declares a tool on a function (alone) or on a method (inside a `#[tools]` impl block).
///
/// `#[tool("description")]`, `#[tool(name = "...", description = "...")]`, or `#[tool]` with a doc comment.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let args = match syn::parse::<ToolArgs>(attr) {
        Ok(args) => args,
        Err(error) => return error.to_compile_error().into(),
    };
    let mut function = match syn::parse::<ItemFn>(item) {
        Ok(function) => function,
        Err(error) => {
            return syn::Error::new(
                error.span(),
                "#[tool] goes on a function; on a method, put #[tools] on the impl block",
            )
            .to_compile_error()
            .into()
        }
    };
    match free_function(args, &mut function) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

/// Implements `decide_agent::ToolBox` for the type of an impl block, with one tool per `#[tool]` method.
#[proc_macro_attribute]
pub fn tools(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return syn::Error::new(Span::call_site(), "#[tools] takes no arguments")
            .to_compile_error()
            .into();
    }
    let mut block = match syn::parse::<ItemImpl>(item) {
        Ok(block) => block,
        Err(error) => return error.to_compile_error().into(),
    };
    match impl_block(&mut block) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

#[derive(Default)]
struct ToolArgs {
    name: Option<LitStr>,
    description: Option<LitStr>,
}

impl Parse for ToolArgs {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut args = ToolArgs::default();
        if input.is_empty() {
            return Ok(args);
        }
        if input.peek(LitStr) {
            args.description = Some(input.parse()?);
            if !input.is_empty() {
                return Err(input.error("expected only the description: #[tool(\"...\")]"));
            }
            return Ok(args);
        }
        let metas = Punctuated::<Meta, Token![,]>::parse_terminated(input)?;
        for meta in metas {
            let Meta::NameValue(pair) = &meta else {
                return Err(syn::Error::new(
                    meta.span(),
                    "expected name = \"...\" or description = \"...\"",
                ));
            };
            let Expr::Lit(ExprLit {
                lit: Lit::Str(value),
                ..
            }) = &pair.value
            else {
                return Err(syn::Error::new(pair.value.span(), "expected a string"));
            };
            if pair.path.is_ident("name") {
                args.name = Some(value.clone());
            } else if pair.path.is_ident("description") {
                args.description = Some(value.clone());
            } else {
                return Err(syn::Error::new(
                    pair.path.span(),
                    "unknown option: expected name or description",
                ));
            }
        }
        Ok(args)
    }
}

/// The text of the `///` lines among `attrs`, trimmed and joined with newlines; `None` without any.
fn doc_text(attrs: &[Attribute]) -> Option<String> {
    let lines: Vec<String> = attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .filter_map(|a| match &a.meta {
            Meta::NameValue(pair) => match &pair.value {
                Expr::Lit(ExprLit {
                    lit: Lit::Str(s), ..
                }) => Some(s.value().trim().to_owned()),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let text = lines.join("\n").trim().to_owned();
    (!text.is_empty()).then_some(text)
}

fn is_tool_attribute(attr: &Attribute) -> bool {
    attr.path()
        .segments
        .last()
        .is_some_and(|segment| segment.ident == "tool")
}

/// The last path segment of a type, through references: `Option` for `Option<String>`.
fn last_segment(ty: &Type) -> Option<&Ident> {
    match ty {
        Type::Path(path) => path.path.segments.last().map(|s| &s.ident),
        Type::Reference(reference) => last_segment(&reference.elem),
        Type::Paren(paren) => last_segment(&paren.elem),
        Type::Group(group) => last_segment(&group.elem),
        _ => None,
    }
}

enum Param {
    /// A JSON property.
    Argument {
        name: String,
        ident: Ident,
        ty: Box<Type>,
        description: Option<String>,
        required: bool,
    },
    /// The caller's context, by reference or by value.
    Context { by_reference: bool },
}

struct ToolFn {
    name: String,
    description: Option<String>,
    params: Vec<Param>,
    is_async: bool,
    returns_result: bool,
    ident: Ident,
}

/// Reads a function's signature and strips the parameter doc comments, which rustc does not accept there.
fn analyse(
    args: ToolArgs,
    attrs: &[Attribute],
    signature: &mut Signature,
    allow_receiver: bool,
) -> syn::Result<(ToolFn, bool)> {
    if !signature.generics.params.is_empty() {
        return Err(syn::Error::new(
            signature.generics.span(),
            "a tool cannot be generic: the LLM calls it with JSON",
        ));
    }
    let mut params = Vec::new();
    let mut has_receiver = false;
    for input in signature.inputs.iter_mut() {
        match input {
            FnArg::Receiver(receiver) => {
                if !allow_receiver {
                    return Err(syn::Error::new(receiver.span(), "unexpected self"));
                }
                if receiver.reference.is_none() || receiver.mutability.is_some() {
                    return Err(syn::Error::new(
                        receiver.span(),
                        "a tool method takes &self: tools may run concurrently",
                    ));
                }
                has_receiver = true;
            }
            FnArg::Typed(typed) => {
                let description = doc_text(&typed.attrs);
                typed.attrs.retain(|a| !a.path().is_ident("doc"));
                let Pat::Ident(pat) = &*typed.pat else {
                    return Err(syn::Error::new(
                        typed.pat.span(),
                        "a tool parameter must be a plain name: it becomes a JSON property",
                    ));
                };
                let ty = typed.ty.clone();
                let segment = last_segment(&ty).map(ToString::to_string);
                if segment.as_deref() == Some("InvocationContext") {
                    params.push(Param::Context {
                        by_reference: matches!(*ty, Type::Reference(_)),
                    });
                    continue;
                }
                let ident = pat.ident.clone();
                let name = ident.to_string();
                let name = name.strip_prefix("r#").unwrap_or(&name).to_owned();
                params.push(Param::Argument {
                    name,
                    ident: format_ident!("__arg_{}", ident),
                    required: segment.as_deref() != Some("Option"),
                    ty,
                    description,
                });
            }
        }
    }
    let returns_result = match &signature.output {
        ReturnType::Default => false,
        ReturnType::Type(_, ty) => last_segment(ty).is_some_and(|s| s == "Result"),
    };
    let ident = signature.ident.clone();
    let name = match args.name {
        Some(name) => {
            if name.value().trim().is_empty() {
                return Err(syn::Error::new(name.span(), "a tool name cannot be blank"));
            }
            name.value()
        }
        None => {
            let name = ident.to_string();
            name.strip_prefix("r#").unwrap_or(&name).to_owned()
        }
    };
    let description = args
        .description
        .map(|d| d.value())
        .or_else(|| doc_text(attrs));
    Ok((
        ToolFn {
            name,
            description,
            params,
            is_async: signature.asyncness.is_some(),
            returns_result,
            ident,
        },
        has_receiver,
    ))
}

/// `decide_agent::ToolSpecification` for a tool.
fn specification(tool: &ToolFn) -> TokenStream2 {
    let name = &tool.name;
    let description = match &tool.description {
        Some(d) => quote!(::core::option::Option::Some(#d)),
        None => quote!(::core::option::Option::None),
    };
    let properties = tool.params.iter().filter_map(|param| match param {
        Param::Argument {
            name,
            ty,
            description,
            required,
            ..
        } => {
            let description = match description {
                Some(d) => quote!(::core::option::Option::Some(#d)),
                None => quote!(::core::option::Option::None),
            };
            Some(quote! {
                ::decide_agent::__private::Property {
                    name: #name,
                    schema: ::decide_agent::__private::schema_of::<#ty>(),
                    description: #description,
                    required: #required,
                }
            })
        }
        Param::Context { .. } => None,
    });
    quote! {
        ::decide_agent::__private::specification(#name, #description, ::std::vec![#(#properties),*])
    }
}

/// The statements that read the arguments and the call expression's argument list.
fn arguments(tool: &ToolFn, context: TokenStream2) -> (TokenStream2, Vec<TokenStream2>) {
    let mut reads = Vec::new();
    let mut call = Vec::new();
    for param in &tool.params {
        match param {
            Param::Argument {
                name, ident, ty, ..
            } => {
                reads.push(quote! {
                    let #ident: #ty = ::decide_agent::__private::argument(&mut __arguments, #name)?;
                });
                call.push(quote!(#ident));
            }
            Param::Context { by_reference: true } => call.push(quote!(&#context)),
            Param::Context {
                by_reference: false,
            } => call.push(quote!(::core::clone::Clone::clone(&#context))),
        }
    }
    let reads = quote! {
        #[allow(unused_mut)]
        let mut __arguments = ::decide_agent::__private::parse_arguments(__raw)?;
        #(#reads)*
    };
    (reads, call)
}

/// A `decide_agent::Tool` expression calling `callee` (a path or `__this.method`).
fn tool_expression(tool: &ToolFn, callee: TokenStream2, capture: TokenStream2) -> TokenStream2 {
    let spec = specification(tool);
    let output = if tool.returns_result {
        quote!(::decide_agent::__private::output_result)
    } else {
        quote!(::decide_agent::__private::output)
    };
    if tool.is_async {
        let (reads, call) = arguments(tool, quote!(__context));
        quote! {{
            #capture
            ::decide_agent::Tool::from_async(#spec, move |__raw_owned: ::std::string::String,
                    __context: ::decide_agent::InvocationContext| {
                #capture
                ::std::boxed::Box::pin(async move {
                    let __raw: &str = &__raw_owned;
                    #reads
                    #output(#callee(#(#call),*).await)
                })
            })
        }}
    } else {
        let (reads, call) = arguments(tool, quote!((*__context)));
        quote! {{
            #capture
            ::decide_agent::Tool::blocking(#spec, move |__raw: &str,
                    __context: &::decide_agent::InvocationContext| {
                #reads
                #output(#callee(#(#call),*))
            })
        }}
    }
}

fn free_function(args: ToolArgs, function: &mut ItemFn) -> syn::Result<TokenStream2> {
    let (tool, _) = analyse(args, &function.attrs, &mut function.sig, false)?;
    let ident = &tool.ident;
    let maker = format_ident!("{}_tool", ident.to_string().trim_start_matches("r#"));
    let vis = &function.vis;
    let body = tool_expression(&tool, quote!(#ident), quote!());
    let doc = format!("The `{}` tool: its specification and executor.", tool.name);
    Ok(quote! {
        #function

        #[doc = #doc]
        #vis fn #maker() -> ::decide_agent::Tool {
            #body
        }
    })
}

fn impl_block(block: &mut ItemImpl) -> syn::Result<TokenStream2> {
    if block.trait_.is_some() {
        return Err(syn::Error::new(
            block.span(),
            "#[tools] goes on an inherent impl block",
        ));
    }
    if !block.generics.params.is_empty() {
        return Err(syn::Error::new(
            block.generics.span(),
            "#[tools] does not support generic types",
        ));
    }
    let mut tools = Vec::new();
    for item in block.items.iter_mut() {
        let ImplItem::Fn(method) = item else {
            continue;
        };
        let Some(position) = method.attrs.iter().position(is_tool_attribute) else {
            continue;
        };
        let attr = method.attrs.remove(position);
        let args = match &attr.meta {
            Meta::Path(_) => ToolArgs::default(),
            Meta::List(list) => syn::parse2::<ToolArgs>(list.tokens.clone())?,
            Meta::NameValue(pair) => {
                return Err(syn::Error::new(
                    pair.span(),
                    "expected #[tool(\"...\")] or #[tool(name = \"...\")]",
                ))
            }
        };
        let (tool, has_receiver) = analyse(args, &method.attrs, &mut method.sig, true)?;
        let ident = tool.ident.clone();
        let expression = if has_receiver {
            tool_expression(
                &tool,
                quote!(__this.#ident),
                quote!(let __this = ::std::sync::Arc::clone(&__this);),
            )
        } else {
            tool_expression(&tool, quote!(Self::#ident), quote!())
        };
        tools.push(expression);
    }
    if tools.is_empty() {
        return Err(syn::Error::new(
            block.span(),
            "#[tools] found no #[tool] method in this impl block",
        ));
    }
    let ty = &block.self_ty;
    Ok(quote! {
        #block

        impl ::decide_agent::ToolBox for #ty {
            fn into_tools(self: ::std::sync::Arc<Self>) -> ::std::vec::Vec<::decide_agent::Tool> {
                let __this = self;
                ::std::vec![#(#tools),*]
            }
        }
    })
}
