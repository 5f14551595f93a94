//! What the scheduler asks of its I/O loop ([`Output`]), and the replies it sends: each
//! echoes the fields of the request it answers, so that a postoffice can hand it to the
//! customer that waits.

use van_core::{node_ids, Control, Message, Meta, Node, NodeId};

/// What the I/O loop must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Output {
    /// Open a connection to this node (it has its id set) before sending to it.
    Connect(Node),
    /// Send this message (`meta.recipient` set; `meta.sender` is [`node_ids::SCHEDULER`]).
    Send(Message),
}

/// The fields of a request that its reply echoes.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Echo {
    app_id: i32,
    customer_id: i32,
    request_id: i32,
}

impl Echo {
    pub(super) fn of(meta: &Meta) -> Echo {
        Echo {
            app_id: meta.app_id,
            customer_id: meta.customer_id,
            request_id: meta.request_id,
        }
    }
}

/// A reply of the scheduler to `to`.
pub(super) fn reply(to: NodeId, control: Control, echo: Echo) -> Output {
    Output::Send(Message {
        meta: Meta {
            app_id: echo.app_id,
            customer_id: echo.customer_id,
            request_id: echo.request_id,
            sender: Some(node_ids::SCHEDULER),
            recipient: Some(to),
            request: false,
            control: Some(control),
            ..Meta::default()
        },
        data: van_core::Parts::new(),
    })
}
