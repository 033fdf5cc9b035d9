//! OpenAPI schemas that the `ToSchema` derives cannot infer: fields typed `&'static str` whose values
//! are a fixed few (an `object` name, a finish reason), used through `#[schema(schema_with = …)]` in
//! each API's types so the document ([`crate::openapi`]) lists the values the server writes, and
//! values of more than one shape (a node's device choice).

use serde_json::Value;
use utoipa::openapi::schema::{Object, ObjectBuilder, OneOfBuilder, Schema, SchemaType, Type};

/// A string that is one of `values` (or, when `nullable`, null).
pub fn one_of(values: &[&str], nullable: bool) -> Object {
    let mut enum_values: Vec<Value> = values.iter().map(|v| Value::from(*v)).collect();
    let kind = if nullable {
        enum_values.push(Value::Null);
        SchemaType::from_iter([Type::String, Type::Null])
    } else {
        SchemaType::Type(Type::String)
    };
    ObjectBuilder::new()
        .schema_type(kind)
        .enum_values(Some(enum_values))
        .build()
}

/// A node's device choice as the cluster publishes it: `"cpu"`, `"auto"` or `{"gpu": index}`.
pub fn device_choice() -> Schema {
    let gpu = ObjectBuilder::new()
        .property(
            "gpu",
            ObjectBuilder::new()
                .schema_type(SchemaType::Type(Type::Integer))
                .minimum(Some(0)),
        )
        .required("gpu")
        .build();
    Schema::OneOf(
        OneOfBuilder::new()
            .item(one_of(&["cpu", "auto"], false))
            .item(gpu)
            .build(),
    )
}

/// The errors of a route in OpenAI's shape (every route outside `/v1/messages` and `/api/`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum OpenAiErrors {
    /// A refused request (the cluster's routes answer 404 on a node without a cluster), in OpenAI's
    /// error shape.
    #[response(status = "4XX")]
    Refused(crate::error::ErrorBody),
    /// A failure of the server, in OpenAI's error shape.
    #[response(status = "5XX")]
    Failed(crate::error::ErrorBody),
}

/// The errors of Anthropic's routes, in its shape.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AnthropicErrors {
    /// A refused request, in Anthropic's error shape.
    #[response(status = "4XX")]
    Refused(crate::dialect::anthropic::ErrorBody),
    /// A failure of the server, in Anthropic's error shape.
    #[response(status = "5XX")]
    Failed(crate::dialect::anthropic::ErrorBody),
}

/// The errors of Ollama's routes, in its shape: `{"error": "message"}`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum OllamaErrors {
    /// A refused request.
    #[response(status = "4XX")]
    Refused(crate::dialect::ollama::ErrorLine),
    /// A failure of the server.
    #[response(status = "5XX")]
    Failed(crate::dialect::ollama::ErrorLine),
}
