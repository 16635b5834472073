package org.yuanrong.exception;

/**
 * What the SDK throws when a stream write cannot go out (the client left, the deadline passed,
 * the write is too large). Unchecked here, so code that declares or catches it compiles as with
 * openYuanrong's checked one.
 */
public class YRException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public YRException(String message) {
        super(message);
    }

    public YRException(String message, Throwable cause) {
        super(message, cause);
    }
}
