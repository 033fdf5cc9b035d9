//! Streams on a chosen connection. `libp2p_stream`'s `Control::open_stream` opens a stream on any
//! connection to a peer; with two paths to a peer (two connections, one per address) the data plane
//! must pick one. [`Behaviour`] opens an outbound substream on exactly the connection named
//! ([`PathControl::open_on`] → `NotifyHandler::One`); the other side accepts it through
//! `libp2p_stream` as before (this behaviour's handler only dials, it never listens, so inbound
//! negotiation of the protocol goes to the `libp2p_stream` handler of the same connection).
//!
//! A request for a connection that closed in the meantime is dropped by the swarm, which drops its
//! reply: the caller sees [`PathStreamError::ConnectionGone`].
//!
//! [`Paths`] is what the data plane holds: the [`PathBook`] the network task publishes (the preferred
//! path per peer), streams opened on a path, and a [`PathLease`] per stream so the published path facts
//! say which instances' hops run on which path ([`PathUses`]).

use shoal_ids::InstanceId;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use libp2p::core::transport::PortUse;
use libp2p::core::upgrade::{DeniedUpgrade, ReadyUpgrade};
use libp2p::core::{Endpoint, Multiaddr};
use libp2p::swarm::handler::{ConnectionEvent, DialUpgradeError, FullyNegotiatedOutbound};
use libp2p::swarm::{
    ConnectionDenied, ConnectionHandler, ConnectionHandlerEvent, ConnectionId, FromSwarm,
    NetworkBehaviour, NotifyHandler, StreamUpgradeError, SubstreamProtocol, THandler,
    THandlerInEvent, THandlerOutEvent, ToSwarm,
};
use libp2p::{PeerId, Stream, StreamProtocol};
use tokio::sync::{mpsc, oneshot, watch};

use super::paths::{PathBook, PathId};

/// Why a stream could not be opened on a connection.
#[derive(Debug, thiserror::Error)]
pub enum PathStreamError {
    #[error("the connection closed before the stream opened")]
    ConnectionGone,
    #[error("the peer does not support {0}")]
    Unsupported(StreamProtocol),
    #[error("opening the stream timed out")]
    Timeout,
    #[error("opening the stream failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the network task is gone")]
    Stopped,
    #[error("no connection to the peer")]
    NoPath,
}

type Answer = oneshot::Sender<Result<Stream, PathStreamError>>;

/// One request: a stream of `protocol` on `connection` to `peer`.
struct Open {
    peer: PeerId,
    connection: ConnectionId,
    protocol: StreamProtocol,
    answer: Answer,
}

/// What a handler is asked to open.
#[derive(Debug)]
pub struct OpenOn {
    protocol: StreamProtocol,
    answer: Answer,
}

/// Opens streams on chosen connections; cheap to clone.
#[derive(Clone)]
pub struct PathControl {
    tx: mpsc::UnboundedSender<Open>,
}

impl PathControl {
    /// A stream of `protocol` to `peer` on its connection `connection`.
    pub async fn open_on(
        &self,
        peer: PeerId,
        connection: ConnectionId,
        protocol: StreamProtocol,
    ) -> Result<Stream, PathStreamError> {
        let (answer, rx) = oneshot::channel();
        self.tx
            .send(Open {
                peer,
                connection,
                protocol,
                answer,
            })
            .map_err(|_| PathStreamError::Stopped)?;
        rx.await.map_err(|_| PathStreamError::ConnectionGone)?
    }
}

/// The behaviour: takes requests from its [`PathControl`]s and hands each to its connection's handler.
pub struct Behaviour {
    rx: mpsc::UnboundedReceiver<Open>,
    control: PathControl,
}

impl Behaviour {
    pub fn new() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        Self {
            rx,
            control: PathControl { tx },
        }
    }

    pub fn control(&self) -> PathControl {
        self.control.clone()
    }
}

impl NetworkBehaviour for Behaviour {
    type ConnectionHandler = Handler;
    type ToSwarm = Infallible;

    fn handle_established_inbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: &Multiaddr,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(Handler::default())
    }

    fn handle_established_outbound_connection(
        &mut self,
        _: ConnectionId,
        _: PeerId,
        _: &Multiaddr,
        _: Endpoint,
        _: PortUse,
    ) -> Result<THandler<Self>, ConnectionDenied> {
        Ok(Handler::default())
    }

    fn on_swarm_event(&mut self, _: FromSwarm) {}

    fn on_connection_handler_event(
        &mut self,
        _: PeerId,
        _: ConnectionId,
        event: THandlerOutEvent<Self>,
    ) {
        match event {}
    }

    fn poll(&mut self, cx: &mut Context<'_>) -> Poll<ToSwarm<Infallible, THandlerInEvent<Self>>> {
        match self.rx.poll_recv(cx) {
            Poll::Ready(Some(open)) => Poll::Ready(ToSwarm::NotifyHandler {
                peer_id: open.peer,
                handler: NotifyHandler::One(open.connection),
                event: OpenOn {
                    protocol: open.protocol,
                    answer: open.answer,
                },
            }),
            _ => Poll::Pending,
        }
    }
}

/// One connection's side: opens the substreams asked for, one negotiation at a time per request.
#[derive(Default)]
pub struct Handler {
    queued: VecDeque<OpenOn>,
}

impl ConnectionHandler for Handler {
    type FromBehaviour = OpenOn;
    type ToBehaviour = Infallible;
    type InboundProtocol = DeniedUpgrade;
    type OutboundProtocol = ReadyUpgrade<StreamProtocol>;
    type InboundOpenInfo = ();
    type OutboundOpenInfo = (StreamProtocol, Answer);

    fn listen_protocol(&self) -> SubstreamProtocol<DeniedUpgrade, ()> {
        SubstreamProtocol::new(DeniedUpgrade, ())
    }

    fn poll(
        &mut self,
        _: &mut Context<'_>,
    ) -> Poll<ConnectionHandlerEvent<Self::OutboundProtocol, Self::OutboundOpenInfo, Infallible>>
    {
        match self.queued.pop_front() {
            Some(open) => Poll::Ready(ConnectionHandlerEvent::OutboundSubstreamRequest {
                protocol: SubstreamProtocol::new(
                    ReadyUpgrade::new(open.protocol.clone()),
                    (open.protocol, open.answer),
                ),
            }),
            None => Poll::Pending,
        }
    }

    fn on_behaviour_event(&mut self, event: OpenOn) {
        self.queued.push_back(event);
    }

    fn on_connection_event(
        &mut self,
        event: ConnectionEvent<
            Self::InboundProtocol,
            Self::OutboundProtocol,
            (),
            Self::OutboundOpenInfo,
        >,
    ) {
        match event {
            ConnectionEvent::FullyNegotiatedOutbound(FullyNegotiatedOutbound {
                protocol: stream,
                info: (_, answer),
            }) => {
                let _ = answer.send(Ok(stream));
            }
            ConnectionEvent::DialUpgradeError(DialUpgradeError {
                info: (protocol, answer),
                error,
            }) => {
                let e = match error {
                    StreamUpgradeError::Timeout => PathStreamError::Timeout,
                    StreamUpgradeError::NegotiationFailed => PathStreamError::Unsupported(protocol),
                    StreamUpgradeError::Io(e) => PathStreamError::Io(e),
                    StreamUpgradeError::Apply(never) => match never {},
                };
                let _ = answer.send(Err(e));
            }
            _ => {}
        }
    }
}

/// Which instances' data-plane streams run on which connection (written through [`PathLease`]s by the
/// data plane, read by the network task for the published path facts).
#[derive(Clone, Default)]
pub struct PathUses {
    inner: Arc<Mutex<UsesByConnection>>,
}

/// Per connection, per instance: its streams there, and how many of them are relayed.
type UsesByConnection = HashMap<ConnectionId, BTreeMap<InstanceId, (usize, usize)>>;

/// The instances with data-plane streams on each connection, and those of them whose frames go through
/// the connection itself (relayed: no direct connection could be made).
#[derive(Debug, Default)]
pub struct StreamsOn {
    pub instances: HashMap<ConnectionId, Vec<InstanceId>>,
    pub relayed: HashMap<ConnectionId, Vec<InstanceId>>,
}

impl PathUses {
    fn lease(&self, connection: ConnectionId, instance: &InstanceId) -> PathLease {
        if let Ok(mut m) = self.inner.lock() {
            m.entry(connection)
                .or_default()
                .entry(*instance)
                .or_default()
                .0 += 1;
        }
        PathLease {
            uses: self.clone(),
            connection,
            instance: *instance,
            relayed: false,
        }
    }

    /// The instances with streams on each connection (and the relayed ones).
    pub fn snapshot(&self) -> StreamsOn {
        let Ok(m) = self.inner.lock() else {
            return StreamsOn::default();
        };
        let mut out = StreamsOn::default();
        for (c, users) in m.iter() {
            out.instances.insert(*c, users.keys().cloned().collect());
            let relayed: Vec<InstanceId> = users
                .iter()
                .filter(|(_, (_, r))| *r > 0)
                .map(|(i, _)| *i)
                .collect();
            if !relayed.is_empty() {
                out.relayed.insert(*c, relayed);
            }
        }
        out
    }
}

/// One data-plane stream's use of a connection, counted while it lives.
pub struct PathLease {
    uses: PathUses,
    connection: ConnectionId,
    instance: InstanceId,
    relayed: bool,
}

impl PathLease {
    /// Marks the stream as relayed: its frames go through the connection itself (published in the
    /// path's facts, `relayed`).
    pub fn set_relayed(&mut self) {
        if self.relayed {
            return;
        }
        self.relayed = true;
        if let Ok(mut m) = self.uses.inner.lock()
            && let Some(n) = m
                .get_mut(&self.connection)
                .and_then(|u| u.get_mut(&self.instance))
        {
            n.1 += 1;
        }
    }
}

impl Drop for PathLease {
    fn drop(&mut self) {
        if let Ok(mut m) = self.uses.inner.lock()
            && let Some(users) = m.get_mut(&self.connection)
        {
            if let Some(n) = users.get_mut(&self.instance) {
                n.0 -= 1;
                n.1 -= usize::from(self.relayed);
                if n.0 == 0 {
                    users.remove(&self.instance);
                }
            }
            if users.is_empty() {
                m.remove(&self.connection);
            }
        }
    }
}

/// The data plane's access to paths: the preferred path to each peer (a [`PathBook`] after every
/// change) and streams opened on a chosen one. Cheap to clone.
#[derive(Clone)]
pub struct Paths {
    pub(super) control: PathControl,
    pub(super) book: watch::Receiver<Arc<PathBook>>,
    pub(super) uses: PathUses,
    /// Connections found gone when a stream was asked of them, for the network task to drop from the
    /// book (a book that kept naming one would have every stream to that peer fail).
    pub(super) gone: mpsc::UnboundedSender<(PeerId, ConnectionId)>,
}

/// A stream on a path, and what keeps the path counted as carrying it.
pub struct PathStream {
    pub stream: Stream,
    pub path: PathId,
    pub lease: PathLease,
}

impl Paths {
    /// The paths of every connected peer, now.
    pub fn book(&self) -> Arc<PathBook> {
        self.book.borrow().clone()
    }

    /// A receiver that sees every new [`PathBook`].
    pub fn watch(&self) -> watch::Receiver<Arc<PathBook>> {
        self.book.clone()
    }

    /// Opens a stream of `protocol` for `instance` on the preferred path to `peer`.
    pub async fn open(
        &self,
        peer: PeerId,
        protocol: StreamProtocol,
        instance: &InstanceId,
    ) -> Result<PathStream, PathStreamError> {
        let path = self
            .book()
            .preferred(&peer)
            .ok_or(PathStreamError::NoPath)?;
        self.open_on(peer, path, protocol, instance).await
    }

    /// Opens a stream of `protocol` for `instance` on `path` to `peer`.
    pub async fn open_on(
        &self,
        peer: PeerId,
        path: PathId,
        protocol: StreamProtocol,
        instance: &InstanceId,
    ) -> Result<PathStream, PathStreamError> {
        let stream = match self.control.open_on(peer, path.connection, protocol).await {
            Err(PathStreamError::ConnectionGone) => {
                let _ = self.gone.send((peer, path.connection));
                return Err(PathStreamError::ConnectionGone);
            }
            other => other?,
        };
        Ok(PathStream {
            stream,
            path,
            lease: self.uses.lease(path.connection, instance),
        })
    }
}
