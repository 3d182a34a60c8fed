/** The firmware catalog (to be built). */
export function Firmware() {
  return (
    <main>
      <h1>Firmware</h1>
    </main>
  );
}
