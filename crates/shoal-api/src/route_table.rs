//! [`Routes`]: the router built together with the list of what it serves. Every route of
//! [`crate::router`] is added through it (with its method named once), so the list is the router's own
//! and the OpenAPI document ([`crate::openapi`]) is checked against it in the tests: a route added
//! without a doc entry, or a doc entry no route serves, fails them.

use axum::Router;
use axum::handler::Handler;
use axum::routing::{MethodRouter, delete, get, post};

use crate::ApiState;

/// One route served: its method and its path as axum matches it (`{*id}` for a tail that may hold
/// `/`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Served {
    pub method: &'static str,
    pub path: &'static str,
}

/// A router and the routes it serves.
pub struct Routes {
    router: Router<ApiState>,
    served: Vec<Served>,
}

impl Default for Routes {
    fn default() -> Self {
        Routes {
            router: Router::new(),
            served: Vec::new(),
        }
    }
}

impl Routes {
    pub fn new() -> Self {
        Routes::default()
    }

    /// `GET path`.
    pub fn get<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, ApiState>,
        T: 'static,
    {
        self.on("GET", path, get(handler))
    }

    /// `POST path`.
    pub fn post<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, ApiState>,
        T: 'static,
    {
        self.on("POST", path, post(handler))
    }

    /// `DELETE path`.
    pub fn delete<H, T>(self, path: &'static str, handler: H) -> Self
    where
        H: Handler<T, ApiState>,
        T: 'static,
    {
        self.on("DELETE", path, delete(handler))
    }

    /// `method path` answered by `route`, a method router that serves `method` alone (one with a layer
    /// of its own, say); the tests send every listed route its method.
    pub fn on(
        mut self,
        method: &'static str,
        path: &'static str,
        route: MethodRouter<ApiState>,
    ) -> Self {
        self.router = self.router.route(path, route);
        self.served.push(Served { method, path });
        self
    }

    /// Both sets of routes.
    pub fn merge(mut self, other: Routes) -> Self {
        self.router = self.router.merge(other.router);
        self.served.extend(other.served);
        self
    }

    /// The router changed by `f` (a `route_layer` over the routes so far); `f` adds no route.
    pub fn map(mut self, f: impl FnOnce(Router<ApiState>) -> Router<ApiState>) -> Self {
        self.router = f(self.router);
        self
    }

    /// What the routes serve.
    pub fn served(&self) -> &[Served] {
        &self.served
    }

    pub fn into_router(self) -> Router<ApiState> {
        self.router
    }
}
