package org.yuanrong.fnstream;

import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import org.yuanrong.exception.YRException;
import org.yuanrong.services.runtime.action.Stream;

/**
 * One invocation inside the JVM: its stream's credits (backpressure from the frontend) and its
 * cancel state. A write waits for a credit; a cancel wakes it and interrupts the handler thread.
 */
final class Invocation {
    final String id;
    final String traceId;
    final JsonElement event;
    final boolean streaming;
    final long deadlineNanos;
    final String sessionId;
    final Stream stream;
    private final Worker worker;
    private int credits;
    // Stream text in flight (sent, not yet credited back), as runtime/process/child/flow.py's WINDOW_BYTES:
    // the frontend holds at most this much of one invocation when its client is slow.
    static final int WINDOW_CHARS = 256 * 1024;
    private final java.util.ArrayDeque<Integer> unacked = new java.util.ArrayDeque<>();
    private long unackedChars;
    private volatile String cancelReason;
    private volatile boolean ended; // the handler returned: a write from a thread it left behind throws
    private Thread thread;

    Invocation(JsonObject msg, Worker worker) {
        this.worker = worker;
        this.id = msg.get("id").getAsString();
        this.traceId = Wire.optString(msg, "trace_id");
        this.event = msg.get("event");
        this.streaming = msg.get("streaming").getAsBoolean();
        this.deadlineNanos = System.nanoTime() + (long) (msg.get("timeout").getAsDouble() * 1e9);
        String session = Wire.optString(msg, "session_id");
        this.sessionId = session == null ? "" : session;
        this.credits = worker.maxCredits;
        this.stream = new Stream(this::write);
        this.stream.setMaxWriteSize(msg.get("max_write_size").getAsInt());
    }

    long remainingMillis() {
        return Math.max(0, (deadlineNanos - System.nanoTime()) / 1_000_000);
    }

    String cancelReason() {
        return cancelReason;
    }

    synchronized void bind(Thread t) {
        thread = t;
        if (cancelReason != null && t != null) {
            t.interrupt();
        }
    }

    synchronized void cancel(String reason) {
        if (cancelReason == null) {
            cancelReason = reason;
        }
        notifyAll();
        if (thread != null) {
            thread.interrupt();
        }
    }

    /** The handler returned (its outcome is about to be sent): later writes throw instead of vanishing. */
    synchronized void end() {
        ended = true;
        notifyAll();
    }

    private void checkOpen() {
        if (cancelReason != null) {
            throw new YRException("stream closed: " + cancelReason);
        }
        if (ended) {
            throw new YRException("stream closed: the invocation has ended");
        }
    }

    synchronized void credit(int n) {
        credits += n;
        for (int i = 0; i < n && !unacked.isEmpty(); i++) {
            unackedChars -= unacked.removeFirst();
        }
        notifyAll();
    }

    /** Room for one more write of `size` in flight? At most the credits, and WINDOW_CHARS (one larger write alone). */
    private boolean hasRoom(int size) {
        return credits > 0 && (unackedChars == 0 || unackedChars + size <= WINDOW_CHARS);
    }

    /** A stream write: waits for a credit, then goes out on the socket at once. */
    private void write(String payload) {
        if (!streaming) {
            checkOpen();
            return; // a plain JSON request has no stream: writes are dropped, as in Python
        }
        synchronized (this) {
            while (!hasRoom(payload.length())) {
                if (cancelReason != null || ended) {
                    break;
                }
                long left = remainingMillis();
                if (left <= 0) {
                    throw new YRException("stream write timed out: the client is not reading");
                }
                try {
                    wait(left);
                } catch (InterruptedException e) {
                    Thread.currentThread().interrupt();
                    if (cancelReason == null) {
                        throw new YRException("stream write interrupted", e);
                    }
                }
            }
            checkOpen();
            credits--;
            unacked.addLast(payload.length());
            unackedChars += payload.length();
        }
        worker.sendWrite(id, payload);
    }
}
