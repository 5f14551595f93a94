//! The receiving half of [`Machine`]: receive buffers and the credits they become, the
//! peer's large-frame announcements (reserve, reply, written, decoded) and delivery in the
//! peer's order.

use van_core::wire::HEADER_LEN;

use super::{Action, DeliverySlot, Inbound, Incoming, Machine, Phase, ReplyOut};

impl<F, M> Machine<F, M> {
    /// A SEND from the peer arrived in receive buffer `slot`.
    pub(super) fn on_received(
        &mut self,
        slot: usize,
        credits: u16,
        incoming: Incoming<M>,
    ) -> Result<(), String> {
        self.consume_receive(slot)?;
        self.add_credits(credits)?;
        match incoming {
            Incoming::Data(message) => self.arrive(message),
            Incoming::Credit => {}
            Incoming::Start { id, len } => self.on_start(id, len)?,
            Incoming::Reply {
                id,
                len,
                addr,
                rkey,
            } => self.on_reply(id, len, addr, rkey)?,
        }
        self.repost(slot);
        Ok(())
    }

    /// The peer's WRITE_WITH_IMM of large frame `id` used receive buffer `slot`.
    pub(super) fn on_written(&mut self, slot: usize, id: u32, len: usize) -> Result<(), String> {
        self.consume_receive(slot)?;
        let Some(&Inbound::Replied(expected)) = self.incoming.get(&id) else {
            return Err("peer wrote a large message it never announced".into());
        };
        // `len` counts the last piece only (a frame over the port's message size is written
        // in pieces); the frame's own header says how long it is, and decoding checks that
        // against what was announced.
        if len > expected {
            return Err(format!(
                "peer wrote {len} bytes for a message announced as {expected}"
            ));
        }
        self.incoming.insert(id, Inbound::Decoding);
        self.out.push_back(Action::Decode { id, len: expected });
        self.repost(slot);
        Ok(())
    }

    /// The buffer for the peer's large frame `id` is reserved: the reply waits for a credit.
    pub(super) fn on_reserved(&mut self, id: u32, addr: u64, rkey: u32) -> Result<(), String> {
        let Some(state) = self.incoming.get_mut(&id) else {
            return Err(format!(
                "a buffer was reserved for frame {id}, never announced"
            ));
        };
        let Inbound::Announced(len) = *state else {
            return Err(format!("a buffer was reserved twice for frame {id}"));
        };
        *state = Inbound::Replied(len);
        self.replies.push_back(ReplyOut {
            id,
            len: len as u64,
            addr,
            rkey,
        });
        Ok(())
    }

    /// Large frame `id` is decoded: it takes its place in the order, and what is ready goes.
    pub(super) fn on_decoded(&mut self, id: u32, message: M) -> Result<(), String> {
        if self.incoming.get(&id) != Some(&Inbound::Decoding) {
            return Err(format!("frame {id} was decoded before it was written"));
        }
        self.incoming.remove(&id);
        match self
            .order
            .iter_mut()
            .find(|p| matches!(p, DeliverySlot::Awaiting(a) if *a == id))
        {
            Some(entry) => *entry = DeliverySlot::Ready(message),
            None => return Err("a written message has no place in the order".into()),
        }
        while let Some(DeliverySlot::Ready(_)) = self.order.front() {
            if let Some(DeliverySlot::Ready(message)) = self.order.pop_front() {
                self.out.push_back(Action::Deliver(message));
            }
        }
        Ok(())
    }

    /// The peer announced large frame `id` of `len` bytes: reserve a buffer for it, and keep
    /// its place in the order.
    fn on_start(&mut self, id: u32, len: u64) -> Result<(), String> {
        let limit = self.max_frame;
        if len > limit || len < HEADER_LEN as u64 {
            return Err(format!(
                "peer announced a {len}-byte frame (limit {limit} bytes)"
            ));
        }
        let announced = self
            .incoming
            .values()
            .filter(|i| **i != Inbound::Decoding)
            .count();
        if announced >= self.posted.len() {
            return Err("peer announced more large messages than it may".into());
        }
        if self.incoming.contains_key(&id) {
            return Err("peer announced a large message id twice".into());
        }
        let len = usize::try_from(len).map_err(|_| "frame too large".to_owned())?;
        self.incoming.insert(id, Inbound::Announced(len));
        self.order.push_back(DeliverySlot::Awaiting(id));
        self.out.push_back(Action::Reserve { id, len });
        Ok(())
    }

    /// A whole message arrived: delivered now, or after the large frames before it.
    fn arrive(&mut self, message: M) {
        if self.order.is_empty() {
            self.out.push_back(Action::Deliver(message));
        } else {
            self.order.push_back(DeliverySlot::Ready(message));
        }
    }

    /// Takes receive buffer `slot` as used by the peer: it must have been posted, and the
    /// peer must have had a credit for it (a posted buffer not yet returned as one is not).
    fn consume_receive(&mut self, slot: usize) -> Result<(), String> {
        let Some(posted) = self.posted.get_mut(slot).filter(|p| **p) else {
            return Err(format!(
                "a receive into buffer {slot} completed that was not posted"
            ));
        };
        if self.posted_count <= self.owed {
            return Err("peer sent without a credit".into());
        }
        *posted = false;
        self.posted_count -= 1;
        Ok(())
    }

    /// Posts a used receive buffer again: a credit we owe the peer. Not after its end.
    fn repost(&mut self, slot: usize) {
        if self.phase != Phase::Open {
            return;
        }
        if let Some(posted) = self.posted.get_mut(slot) {
            *posted = true;
            self.posted_count += 1;
            self.owed += 1;
            self.out.push_back(Action::PostReceive { slot });
        }
    }
}
