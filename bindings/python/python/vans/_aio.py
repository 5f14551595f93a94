"""asyncio support: ``await request`` for the :class:`vans.Request` of an ``*_async`` call."""

import asyncio


def await_request(request):
    """The iterator behind ``Request.__await__``: completes an asyncio future from the
    request's completion callback (which runs on a vans I/O thread)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value, error):
        if future.cancelled():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    def done(value, error):
        loop.call_soon_threadsafe(settle, value, error)

    request.add_done_callback(done)
    return future.__await__()
